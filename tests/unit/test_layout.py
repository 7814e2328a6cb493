"""The layout of docs/DESIGN.md holds: packages import only the floors below them (no cycle; runtime/ imports
nothing of draftsmith, models/ only runtime/), no two modules import each other (directly or around a circle),
no library module grows past ~400 lines nor a function past 70, the tests mirror the package, and every
document the code cites is in the repository's docs/."""

from __future__ import annotations

import re
from pathlib import Path

from layout_rules import (
    ALLOWED,
    PACKAGES,
    SRC,
    broken_rules,
    import_map,
    long_functions,
    module_cycles,
    module_imports,
    oversized,
)

REPO = Path(__file__).resolve().parents[2]


def test_packages_import_only_what_the_design_allows():
    table = import_map()
    assert table["runtime"] == set() and table["models"] <= {"runtime"}
    assert broken_rules(table) == []
    assert "eval" not in table["train"] and "train" not in table["ship"]  # ship and train never meet


def test_the_rule_checker_catches_a_cycle_and_a_forbidden_import():
    table: dict[str, set[str]] = {p: set() for p in PACKAGES}
    table["models"] = {"train"}
    table["train"] = {"models"}
    problems = broken_rules(table)
    assert any("models imports ['train']" in p for p in problems)
    assert any(p.startswith("import cycle: models -> train -> models") for p in problems)
    assert set(ALLOWED) == set(PACKAGES)


def test_no_module_is_oversized():
    assert oversized() == []


def test_no_function_is_longer_than_a_screen():
    assert long_functions() == []


def test_no_two_modules_import_each_other():
    assert module_cycles(module_imports()) == []


def test_the_cycle_finder_finds_a_circle_of_three_and_nothing_in_a_chain():
    chain = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert module_cycles(chain) == []
    assert module_cycles({**chain, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_relative_and_package_imports_resolve_to_modules():
    graph = module_imports()
    # `from .decoder import Generation` in eval/report.py, `from draftsmith.eval.drafters import ...` elsewhere
    assert "draftsmith.eval.decoder" in graph["draftsmith.eval.report"]
    assert "draftsmith.eval.drafters" in graph["draftsmith.eval.acceptance"]
    assert graph["draftsmith.runtime.files"] == {"draftsmith.runtime.errors"}


def test_the_tests_mirror_the_package():
    """Each package's unit tests sit in tests/unit/<package>/ (the stages a reader looks for)."""
    tests = REPO / "tests" / "unit"
    for package in PACKAGES:
        if package == "scripts":  # the CLI's commands are tested where their stage is
            continue
        assert (tests / package).is_dir() and list((tests / package).rglob("test_*.py")), package


def test_every_cited_document_is_in_the_repository():
    cited = re.compile(r"\b([A-Z][A-Z-]+\.md)\b")
    missing = set()
    for folder in (
        *(SRC / p for p in PACKAGES),
        SRC / "recipes",
        REPO / "bench",
        REPO / "tests",
        REPO / "train",
    ):
        for path in folder.rglob("*.py"):
            for name in cited.findall(path.read_text()):
                if name == "SOURCES.md":  # the manifest of the data folder tests read, not a design document
                    continue
                if not (REPO / "docs" / name).is_file() and not (REPO / name).is_file():
                    missing.add(f"{path.relative_to(REPO)} cites {name}")
            outside = "../shared" + "/docs"  # spelled in two parts so that this file does not cite it
            assert outside not in path.read_text(), f"{path} cites a document outside the repository"
    assert sorted(missing) == []
