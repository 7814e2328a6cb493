"""The package import map: which draftsmith package imports which, checked against docs/DESIGN.md section 2.

    python -m bench.import_map            # prints the table and the largest modules; exit 1 on a broken rule

Imports are read from the source (ast), at any depth (lazy imports inside functions count too), so the map
is what could be imported, not what happened to be.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "draftsmith"
# the floors, lowest first: runtime is the ground floor (errors, files, run locks) that every stage stands on
PACKAGES = ("runtime", "config", "models", "data", "train", "eval", "ship", "engines", "toy", "scripts")
# package -> the draftsmith packages it may import (besides itself); DESIGN.md section 2
ALLOWED = {
    "runtime": set(),
    "config": {"runtime"},
    "models": {"runtime"},
    "data": {"runtime", "models"},
    "train": {"runtime", "config", "models", "data"},
    "eval": {"runtime", "config", "models", "data"},
    "toy": {"runtime", "models", "data"},
    "ship": {"runtime", "config", "models", "data", "eval"},
    "engines": {"runtime", "config", "models", "data", "eval", "ship"},
    "scripts": {"runtime", "config", "models", "data", "train", "eval", "ship", "engines", "toy"},
}
MAX_LINES = 420  # "about 400 lines" a module; entry scripts and the CLI are held to the same bound


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "draftsmith" and len(parts) > 1 and parts[1] in PACKAGES:
        return parts[1]
    return None


def imports(path: Path, package: str) -> set[str]:
    """The draftsmith packages `path` (in `package`) imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {p for a in node.names if (p := _package_of(a.name))}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package
                found.add(package)
            elif node.module and (p := _package_of(node.module)):
                found.add(p)
    return found


def import_map() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            out[package] |= imports(path, package) - {package}
    return out


def broken_rules(table: dict[str, set[str]]) -> list[str]:
    problems = [
        f"{p} imports {sorted(used - ALLOWED[p])} (allowed: {sorted(ALLOWED[p]) or 'none'})"
        for p, used in table.items()
        if used - ALLOWED[p]
    ]
    seen: list[str] = []

    def visit(p: str, stack: list[str]) -> None:
        if p in stack:
            problems.append("import cycle: " + " -> ".join([*stack[stack.index(p) :], p]))
            return
        if p in seen:
            return
        seen.append(p)
        for q in sorted(table[p]):
            visit(q, [*stack, p])

    for p in PACKAGES:
        visit(p, [])
    return problems


def module_sizes() -> list[tuple[int, str]]:
    sizes = []
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            sizes.append((len(path.read_text().splitlines()), str(path.relative_to(REPO))))
    return sorted(sizes, reverse=True)


def oversized() -> list[str]:
    return [f"{name}: {n} lines" for n, name in module_sizes() if n > MAX_LINES]


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m bench.import_map",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    table = import_map()
    print("| package | imports | allowed |\n|---|---|---|")
    for p in PACKAGES:
        print(f"| {p} | {', '.join(sorted(table[p])) or '-'} | {', '.join(sorted(ALLOWED[p])) or '-'} |")
    sizes = module_sizes()
    print(f"\n{len(sizes)} modules; the largest: " + ", ".join(f"{name} {n}" for n, name in sizes[:6]))
    problems = broken_rules(table) + oversized()
    for problem in problems:
        print(f"BROKEN: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
