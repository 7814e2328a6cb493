"""The layout of docs/DESIGN.md holds: packages import only the floors below them (no cycle; runtime/ imports
nothing of draftsmith, models/ only runtime/), no library module grows past ~400 lines, and every
document the code cites is in the repository's docs/."""

from __future__ import annotations

import re
from pathlib import Path

from bench.import_map import ALLOWED, PACKAGES, SRC, broken_rules, import_map, oversized

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
