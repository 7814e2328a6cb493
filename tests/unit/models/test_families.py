"""Every drafter family is one complete record: each part it names exists (imported and of the right sort),
each part it lacks says why, every engine is either served by a layout or refused with a reason, and the rest
of draftsmith looks kinds up there (no second table keyed by kind)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from draftsmith.models.families import ENGINES, FAMILIES, family, train_methods
from draftsmith.models.serving import SUMMARY, serving_engines

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "draftsmith"
PARTS = ("module", "config", "train_method", "drafter")
KINDS = frozenset(FAMILIES)
# (module, kind) pairs allowed to name one kind in a branch, each for a stated reason.
ALLOWED = {
    # The closed-loop check of the EAGLE-3 vLLM export against speculators' reference model: a tool for one
    # kind, refusing the others; adding a family never touches it.
    ("engines/check_engine_load.py", "eagle3"),
}


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_every_part_exists_or_says_why_not(kind):
    f = family(kind)
    assert f.kind == kind and f.title and f.tags
    for part in PARTS:
        if getattr(f, part) is None:
            assert f.why_not.get(part), f"{kind}: {part} is missing without a reason"
            with pytest.raises(ValueError, match=f"has no {part}"):
                f.resolve(part)
        elif part == "train_method":
            assert (SRC / "train" / f"{f.train_method}.py").is_file()
        else:
            assert callable(f.resolve(part)), (kind, part)
    if f.config is not None:
        assert dataclasses.is_dataclass(f.resolve("config"))
    if f.module is not None and isinstance(f.resolve("module"), type):
        assert issubclass(f.resolve("module"), torch.nn.Module)
        assert f.resolve("module").kind == kind  # what its checkpoints' config.json says
    for engine in ENGINES:
        assert f.serves(engine) or f.why_not.get(engine), f"{kind}: {engine} neither served nor refused"
        if f.serves(engine):
            assert callable(f.resolve(f"layout:{engine}"))
    assert set(f.layouts) <= set(ENGINES) and not set(f.layouts) & set(f.why_not)
    if f.served_target is not None:
        assert callable(f.resolve("served_target"))
    # every trained kind has a tiny run, so the architecture matrix covers it by its record alone
    assert (f.tiny_recipe is None) == (f.train_method is None), f"{kind}: tiny_recipe"
    if f.tiny_recipe is not None:
        assert (SRC / "recipes" / f.tiny_recipe).is_file() and f.tiny_recipe.startswith(f"{f.train_method}/")
    if f.served_targets is not None:
        assert f.resolve("served_targets") and all(isinstance(t, str) for t in f.resolve("served_targets"))
    for engines in f.layer_engines.values():
        assert engines and set(engines) < set(f.layouts) - {"hf"}
    assert f.serving_note or not (f.served_targets or f.layer_engines), f"{kind}: serving limits not worded"
    if f.module is not None and isinstance(f.resolve("module"), type):  # d2t: the draft -> target id map
        assert f.vocab_map == ("d2t" in typing.get_type_hints(f.resolve("module"))), kind


@pytest.mark.parametrize("kind", sorted(k for k, f in FAMILIES.items() if isinstance(f.module, str)))
def test_the_loader_takes_the_config_the_constructor_takes(kind):
    """The checkpoint loader builds `draft:` settings from the record's `config`: the class the module's
    constructor is typed to take (what the loader found by reflection before)."""
    cls = family(kind).resolve("module")
    if isinstance(cls, type):
        assert typing.get_type_hints(cls.__init__)["config"] is family(kind).resolve("config")  # type: ignore[misc]


LLAMA, DEEPSEEK = SimpleNamespace(model_type="llama"), SimpleNamespace(model_type="deepseek_v3")


@pytest.mark.parametrize(
    ("kind", "target", "layer", "engines"),
    [  # what models/serving.py answered before the limits moved into the records
        ("medusa", LLAMA, "llama", ("vllm", "tgi")),
        ("eagle", LLAMA, "llama", ("vllm", "sglang")),
        ("eagle3", LLAMA, "llama", ("vllm", "sglang")),
        ("eagle3", LLAMA, "qwen3", ("vllm",)),
        ("mtp", LLAMA, "llama", ()),
        ("mtp", DEEPSEEK, "llama", ("vllm", "sglang")),
        ("draft_lm", LLAMA, "llama", ("vllm", "sglang")),
        ("dflash", LLAMA, "llama", ("vllm", "sglang")),
        ("peagle", LLAMA, "llama", ("vllm",)),
        ("ngram", LLAMA, "llama", ()),
    ],
)
def test_serving_engines_follow_the_records(kind, target, layer, engines):
    assert serving_engines(kind, target, layer) == engines


def test_help_texts_list_every_kind():
    """`draftsmith export --help`, the serving summary and `draftsmith --help` are written from the records."""
    from draftsmith.ship.export import help_text

    table = help_text()
    for kind, f in FAMILIES.items():
        if f.module is None:
            continue
        row = next(line for line in table.splitlines() if line.split()[:1] == [kind])
        assert row.split()[1:2] == [", ".join(e for e in ENGINES if f.serves(e)).split()[0]]
        assert all(f"{e}: {f.why_not[e]}" in table for e in ENGINES if not f.serves(e))
        assert f.serving_note in table
        if f.layouts:
            assert f"{kind}: " in SUMMARY
    assert "peagle: vllm (any target)" in SUMMARY and "dflash: vllm, sglang (any target)" in SUMMARY


def test_draft_lm_and_ngram_are_kinds_like_the_others():
    assert {"draft_lm", "ngram"} <= set(FAMILIES)
    methods = train_methods()
    expected = {
        "distill": ["draft_lm"],
        "eagle": ["eagle", "eagle3"],
        "medusa": ["medusa"],
        "mtp": ["mtp"],
        "dflash": ["dflash"],
    }
    assert {m: methods.get(m) for m in expected} == expected


def _names_kind(node: ast.expr) -> bool:
    """`kind`, `x.kind`, `x["kind"]`, `export_kind`: an expression that holds a drafter kind."""
    if isinstance(node, ast.Name):
        return node.id == "kind" or node.id.endswith("_kind")
    if isinstance(node, ast.Attribute):
        return node.attr == "kind" or node.attr.endswith("_kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    return False


def _kinds_in(node: ast.expr | None) -> list[str]:
    """The known kinds a constant, or a tuple / list / set of constants, spells."""
    if isinstance(node, ast.Constant) and node.value in KINDS:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in KINDS]
    return []


def kind_branches(source: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """`(line, what, kinds)` for every spot of `source` that names kinds by hand: a comparison of a kind with
    a known kind (`kind == "x"`, `!=`, `in ("x", "y")`), a tuple / list / set of two or more known kinds, or
    a dict keyed by a known kind, or a conditional expression choosing between two known kinds."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for left, op, right in zip(operands[:-1], node.ops, operands[1:], strict=True):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for a, b in ((left, right), (right, left)):
                    if _names_kind(a) and _kinds_in(b):
                        found.append((node.lineno, "branch on a kind", tuple(_kinds_in(b))))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(_kinds_in(node)) >= 2:
            found.append((node.lineno, "list of kinds", tuple(_kinds_in(node))))
        elif isinstance(node, ast.IfExp) and _kinds_in(node.body) and _kinds_in(node.orelse):
            found.append((node.lineno, "choice of kinds", (*_kinds_in(node.body), *_kinds_in(node.orelse))))
        elif isinstance(node, ast.Dict):
            keyed = [k for key in node.keys for k in _kinds_in(key)]
            if keyed:
                found.append((node.lineno, "table keyed by kind", tuple(keyed)))
    return sorted(set(found))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('if kind == "eagle3":\n    pass', [(1, "branch on a kind", ("eagle3",))]),
        ('x = "mtp" != source["kind"]', [(1, "branch on a kind", ("mtp",))]),
        (
            'if self.kind in ("medusa", "dflash"):\n    pass',
            [(1, "branch on a kind", ("medusa", "dflash")), (1, "list of kinds", ("medusa", "dflash"))],
        ),
        ("ok = export_kind not in {'peagle'}", [(1, "branch on a kind", ("peagle",))]),
        ('KINDS = ["eagle", "draft_lm"]', [(1, "list of kinds", ("eagle", "draft_lm"))]),
        ('T = {"medusa": 1}', [(1, "table keyed by kind", ("medusa",))]),
        ('name = "eagle3" if v3 else "eagle"', [(1, "choice of kinds", ("eagle3", "eagle"))]),
        # not kinds, or not a kind compared: left alone
        ('if kind == "ce":\n    pass', []),
        ('if spec == "ngram":\n    pass', []),
        ('x = ("medusa",)\ny = {"kind": "draft_lm"}\nname = "eagle3" if v3 else "a"', []),
    ],
)
def test_the_kind_checker_finds_planted_branches(source, expected):
    assert kind_branches(source) == sorted(expected)


def test_no_other_module_branches_on_or_lists_kinds():
    """The consumers ask the families: no module under src/draftsmith but models/families.py branches on a kind,
    lists kinds by hand, or spells a table keyed by kind."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "models/families.py":
            continue
        for line, what, kinds in kind_branches(path.read_text()):
            if len(kinds) == 1 and (rel, kinds[0]) in ALLOWED:
                continue
            offenders.append(f"src/draftsmith/{rel}:{line}: {what} {', '.join(kinds)}")
    assert offenders == [], "ask models/families.py (add a field to Family) instead:\n" + "\n".join(offenders)
