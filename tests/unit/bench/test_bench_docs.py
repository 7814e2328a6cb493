"""Every bench/ module says which measurement it feeds: its docstring names a section of docs/BENCHMARKS.md (or of
docs/DEVLOG.md, for the project's own checks) that exists, or other bench modules import it as a helper.

    python tests/unit/bench/test_bench_docs.py     # the bench/ listing: each module and what it feeds
"""

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


def cited_sections(path: Path) -> list[tuple[str, str]]:
    """`(document, section)` pairs a module's docstring names."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
    return [(d, name) for d, names in CITED.findall(doc) for name in re.findall(r'"([^"]+)"', names)]


def modules() -> list[Path]:
    return [p for p in sorted(BENCH.rglob("*.py")) if p.name != "__init__.py"]


def test_every_bench_module_names_what_it_feeds():
    sections = {"BENCHMARKS": headings("BENCHMARKS"), "DEVLOG": headings("DEVLOG")}
    imported = helpers()
    unnamed, unknown = [], []
    for path in modules():
        cited = cited_sections(path)
        if not cited:
            if path.stem not in imported:
                unnamed.append(str(path.relative_to(REPO)))
            continue
        for doc_name, name in cited:
            if not any(h.startswith(name) for h in sections[doc_name]):
                unknown.append(f"{path.relative_to(REPO)}: {doc_name}.md has no section {name!r}")
    assert unnamed == [], f"bench modules that name no section they feed: {unnamed}"
    assert unknown == []


if __name__ == "__main__":
    from draftsmith.runtime.display import table

    imported = helpers()
    rows = []
    for path in modules():
        cited = cited_sections(path)
        feeds = "; ".join(f'{d}.md, "{name}"' for d, name in cited) or "(a helper of other bench modules)"
        rows.append([str(path.relative_to(REPO)), feeds])
    print("\n".join(table(["module", "feeds"], rows)))
