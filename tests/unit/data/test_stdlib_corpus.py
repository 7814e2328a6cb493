"""The stdlib corpus: well-formed conversations, a module-disjoint stable split, and a self-healing cache."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path

import pytest

from draftsmith.data.stdlib_corpus import (
    HELDOUT_PERCENT,
    Split,
    _cache_file,
    module_split,
    stdlib_conversations,
    stdlib_summary,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    cache = tmp_path_factory.mktemp("cache")
    return cache, stdlib_conversations("all", cache=cache)


def test_split_is_module_disjoint_and_complete(corpus: tuple[Path, list[dict]]) -> None:
    cache, records = corpus
    train = stdlib_conversations("train", cache=cache)
    heldout = stdlib_conversations("heldout", cache=cache)
    train_modules = {r["module"] for r in train}
    heldout_modules = {r["module"] for r in heldout}
    assert not train_modules & heldout_modules
    split_of = {r["id"]: "train" for r in train} | {r["id"]: "heldout" for r in heldout}
    # Every record lands in exactly one split, the one its module hashes to, in the original order.
    assert len(split_of) == len(train) + len(heldout) == len(records)
    assert all(split_of[r["id"]] == module_split(r["module"]) for r in records)
    assert [r["id"] for r in train] == [r["id"] for r in records if split_of[r["id"]] == "train"]
    share = len(heldout_modules) / (len(train_modules) + len(heldout_modules))
    assert 0.4 * HELDOUT_PERCENT / 100 < share < 2.5 * HELDOUT_PERCENT / 100
    assert len({r["id"] for r in records}) == len(records)  # ids are unique


def test_split_is_stable() -> None:
    # Pinned: a change here silently moves prompts between training and evaluation.
    assert [module_split(m) for m in ("json", "textwrap", "base64", "zipfile", "csv")] == [
        "train",
        "train",
        "heldout",
        "heldout",
        "heldout",
    ]


def test_records_are_functions_split_at_the_docstring(corpus: tuple[Path, list[dict]]) -> None:
    _, records = corpus
    for r in records:
        user, assistant = r["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        # Prompt + answer is the function's source again: it parses to one def with the expected name
        # and docstring, and the answer is the indented body after it.
        tree = ast.parse(user["content"] + "\n" + assistant["content"])
        (fn,) = tree.body
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        assert fn.name == r["id"].split("#")[0].rsplit(".", 1)[1]
        assert ast.get_docstring(fn, clean=False) is not None
        code = [ln for ln in assistant["content"].split("\n") if ln.strip() and not ln.startswith("#")]
        assert code[0].startswith((" ", "\t"))  # indented under the def (comments may sit at column 0)
        assert sum(1 for line in assistant["content"].split("\n") if line.strip()) >= 2
        assert len(assistant["content"]) <= 4000


@pytest.mark.parametrize(
    ("fid", "obj", "split"),
    [
        ("textwrap.dedent", textwrap.dedent, "train"),
        ("json.encoder.JSONEncoder.encode", json.JSONEncoder.encode, "train"),
    ],
)
def test_known_function_maps_to_its_source(
    corpus: tuple[Path, list[dict]], fid: str, obj: object, split: Split
) -> None:
    cache, _ = corpus
    record = next(r for r in stdlib_conversations(split, cache=cache) if r["id"] == fid)
    user, assistant = (m["content"] for m in record["messages"])
    source = textwrap.dedent(inspect.getsource(obj)).rstrip()  # type: ignore[arg-type]
    assert user.startswith("def ")
    assert inspect.getdoc(obj).split("\n")[0] in user  # type: ignore[union-attr]
    assert user + "\n" + assistant == source


def test_cache_is_reused_and_rebuilt_when_corrupt(corpus: tuple[Path, list[dict]]) -> None:
    cache, records = corpus
    path = _cache_file(cache)
    assert path.is_file()
    assert not list(path.parent.glob("*.tmp"))  # the atomic write left no temporary file
    header = json.loads(path.read_text(encoding="utf-8").split("\n", 1)[0])
    assert header["count"] == len(records)

    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(lines[: len(lines) // 2]) + '\n{"id": "trunc', encoding="utf-8")
    assert stdlib_conversations("all", cache=cache) == records
    assert len(path.read_text(encoding="utf-8").split("\n")) == len(lines)  # rewritten in full


def test_summary_counts_match(corpus: tuple[Path, list[dict]]) -> None:
    cache, records = corpus
    summary = stdlib_summary(cache=cache)
    assert summary["train"]["conversations"] + summary["heldout"]["conversations"] == len(records)
    chars = sum(len(m["content"]) for r in records for m in r["messages"])
    assert summary["train"]["chars"] + summary["heldout"]["chars"] == chars


def test_bad_split_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'train', 'heldout', 'all'"):
        stdlib_conversations("validation")  # type: ignore[arg-type]  # the wrong split is the point
