"""The fault catalogue, stage inputs: a stage whose input changed is redone or refused, never reused. A data file
edited in place after a feature cache or a training run was made from it is noticed by its content (sha256),
not missed because its path is the same: building into that cache, training from it and resuming that run are
each refused in one line naming the file, and nothing that existed before is changed. The same bytes are
reused (the controls at the end).

Cases run in-process through `draftsmith.scripts.cli.main`, as in test_catalogue.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_catalogue import check_one_line, error_lines, run_case

from draftsmith.runtime.files import sha256_file
from draftsmith.scripts.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
RECIPE = ["--config", "recipes/medusa/tiny.yaml"]
SMALL = ["data.eval=[]", "data.max_samples=16", "data.eval_max_samples=4", "data.max_len=128"]
TRAIN = ["train.max_steps=2", "checkpoint.every=1", "log.every=1"]


@dataclass
class World:
    root: Path
    target: Path  # the tiny toy target


@pytest.fixture(scope="module")
def world(tiny_toy_target, tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("stage-inputs"), Path(tiny_toy_target))


@pytest.fixture(autouse=True)
def in_checkout(monkeypatch):
    monkeypatch.chdir(REPO)  # recipes/ paths as a user in a checkout types them


def write_data(path: Path, first: int = 0, count: int = 20) -> Path:
    """`count` standard-library conversations from record `first` on, as `messages` lines."""
    from draftsmith.data.conversations import read_conversations

    convs = read_conversations("stdlib:train", limit=first + count)[first:]
    path.write_text("".join(json.dumps({"messages": c.messages}) + "\n" for c in convs))
    return path


def cache_args(w: World, data: Path, cache: Path) -> list[str]:
    return [
        "cache",
        "medusa",
        *RECIPE,
        f"target.path={w.target}",
        f"data.train=[{data}]",
        f"data.cache={cache}",
    ]


def train_args(w: World, data: Path, out: Path) -> list[str]:
    return [
        "train",
        "medusa",
        *RECIPE,
        f"target.path={w.target}",
        f"data.train=[{data}]",
        f"output_dir={out}",
    ]


def _cached(w: World, name: str) -> tuple[Path, Path]:
    """`(data file, cache built from it)`, made once per name."""
    data, cache = w.root / f"{name}.jsonl", w.root / name
    if not (cache / "index.json").is_file():
        write_data(data)
        assert cli([*cache_args(w, data, cache), "--shard-tokens", "300", *SMALL]) == 0
    return data, cache


def _trained(w: World, name: str) -> tuple[Path, Path]:
    """`(data file, run trained on it for 2 steps)`, made once per name."""
    data, out = w.root / f"{name}.jsonl", w.root / name
    if not (out / "final").is_dir():
        write_data(data)
        assert cli([*train_args(w, data, out), *SMALL, *TRAIN]) == 0
    return data, out


def _edit(data: Path) -> None:
    """The file edited in place: other conversations under the same path."""
    write_data(data, first=20)


def _edited_cache(w: World) -> list[str]:
    data, cache = _cached(w, "cache-edited")
    _edit(data)
    return [*cache_args(w, data, cache), "--shard-tokens", "300", *SMALL]


def _train_on_edited_cache(w: World) -> list[str]:
    data, cache = _cached(w, "cache-edited-train")
    _edit(data)
    return [*train_args(w, data, w.root / "run-on-edited-cache"), f"data.cache={cache}", *SMALL, *TRAIN]


def _train_on_other_data_cache(w: World) -> list[str]:
    _, cache = _cached(w, "cache-other")
    other = write_data(w.root / "other.jsonl", first=20)
    return [*train_args(w, other, w.root / "run-on-other-cache"), f"data.cache={cache}", *SMALL, *TRAIN]


def _resume_edited_run(w: World) -> list[str]:
    data, out = _trained(w, "run-edited")
    _edit(data)
    return [*train_args(w, data, out), *SMALL, *TRAIN, "--resume"]


# id -> (setup(world) -> argv, the text the one error line must hold)
CASES: dict[str, tuple[Callable[[World], list[str]], str]] = {
    "cache-into-a-cache-of-edited-data": (
        _edited_cache,
        "holds a cache built from data whose content has changed since: ",
    ),
    "train-on-a-cache-of-edited-data": (
        _train_on_edited_cache,
        "was built from other data than the recipe names: ",
    ),
    "train-on-a-cache-of-other-data": (
        _train_on_other_data_cache,
        "other.jsonl is not a file it was made from (made from: ",
    ),
    "train-resume-after-the-data-was-edited": (
        _resume_edited_run,
        "the data it was trained on has changed since: ",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_changed_input_is_refused_in_one_line_and_changes_nothing(case, world, capsys):
    setup, expected = CASES[case]
    argv = setup(world)  # builds and edits first: part of "before"
    code, err, unchanged = run_case(argv, capsys, world.root)
    line = check_one_line(case, code, err, expected, unchanged)
    edited = next((a[len("data.train=[") : -1] for a in argv if a.startswith("data.train=[")), "")
    assert edited and edited in line  # the line names the data file


def test_the_line_names_both_contents_and_what_to_do(world, capsys):
    """The exact lines of an edit in place, against the sha256 of the file's two versions."""
    data, cache = _cached(world, "cache-exact")
    old = sha256_file(data)
    _edit(data)
    new = sha256_file(data)
    capsys.readouterr()
    assert cli([*cache_args(world, data, cache), "--shard-tokens", "300", *SMALL]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"error: {cache} holds a cache built from data whose content has changed since: {data} changed "
        f"(sha256 {old[:12]} then, {new[:12]} now); choose another data.cache directory or delete this one"
    ]
    data, out = _trained(world, "run-exact")
    old = sha256_file(data)
    _edit(data)
    new = sha256_file(data)
    capsys.readouterr()
    assert cli([*train_args(world, data, out), *SMALL, *TRAIN, "--resume"]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"error: cannot resume from {out / 'checkpoint-2'}: the data it was trained on has changed since: "
        f"{data} changed (sha256 {old[:12]} then, {new[:12]} now); train on this data from the start with "
        "another output_dir, or restore the data to resume"
    ]


def test_the_same_content_is_reused(world, capsys):
    """Controls: the same bytes (rewritten, or copied under another name) reuse the cache and resume the run;
    what each recorded is the sha256 of the file."""
    data, cache = _cached(world, "cache-same")
    recorded = {str(data): sha256_file(data)}
    assert json.loads((cache / "index.json").read_text())["data_sha256"] == recorded
    write_data(data)  # the same bytes, rewritten
    shards = {p: p.stat().st_mtime_ns for p in cache.glob("*.safetensors")}
    assert cli([*cache_args(world, data, cache), "--shard-tokens", "300", *SMALL]) == 0
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.safetensors")} == shards
    copy = world.root / "copy.jsonl"
    copy.write_bytes(data.read_bytes())
    run = world.root / "run-from-same-cache"
    assert cli([*train_args(world, copy, run), f"data.cache={cache}", *SMALL, *TRAIN]) == 0
    training = json.loads((run / "final" / "config.json").read_text())["training"]
    assert training["data_sha256"] == recorded  # the content the cache's samples came from

    data, out = _trained(world, "run-same")
    recorded = {str(data): sha256_file(data)}
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["data_sha256"] == recorded
    assert json.loads((out / "final" / "config.json").read_text())["training"]["data_sha256"] == recorded
    write_data(data)
    metrics = (out / "metrics.jsonl").read_text()
    assert cli([*train_args(world, data, out), *SMALL, *TRAIN, "--resume"]) == 0
    train_lines = [
        r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r
    ]
    assert [r["step"] for r in train_lines] == [1, 2]  # no step taken again
    assert metrics.splitlines()[:2] == (out / "metrics.jsonl").read_text().splitlines()[:2]
