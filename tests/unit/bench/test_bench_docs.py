"""Every bench/ module says which measurement it feeds: its docstring names a section of docs/BENCHMARKS.md (or of
docs/DEVLOG.md, for the project's own checks) that exists, or other bench modules import it as a helper."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"
CITED = re.compile(r'docs/(BENCHMARKS|DEVLOG)\.md[,:]?\s+((?:"[^"]+"(?:,?\s*(?:and\s+)?)?)+)')


def headings(doc: str) -> list[str]:
    text = (REPO / "docs" / f"{doc}.md").read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def helpers() -> set[str]:
    """Module names other bench modules import (`from bench.x import`, `import bench.x`, or a sibling import)."""
    names = set()
    for path in BENCH.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.removeprefix("bench.").split(".")[0])
            elif isinstance(node, ast.Import):
                names.update(a.name.removeprefix("bench.").split(".")[0] for a in node.names)
    return names


def test_every_bench_module_names_what_it_feeds():
    sections = {"BENCHMARKS": headings("BENCHMARKS"), "DEVLOG": headings("DEVLOG")}
    imported = helpers()
    unnamed, unknown = [], []
    for path in sorted(BENCH.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
        cited = [(d, name) for d, names in CITED.findall(doc) for name in re.findall(r'"([^"]+)"', names)]
        if not cited:
            if path.stem not in imported:
                unnamed.append(str(path.relative_to(REPO)))
            continue
        for doc_name, name in cited:
            if not any(h.startswith(name) for h in sections[doc_name]):
                unknown.append(f"{path.relative_to(REPO)}: {doc_name}.md has no section {name!r}")
    assert unnamed == [], f"bench modules that name no section they feed: {unnamed}"
    assert unknown == []
