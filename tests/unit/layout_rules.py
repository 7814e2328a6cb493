"""The layout rules tests/unit/test_layout.py enforces: which draftsmith package may import which (docs/DESIGN.md
section 2), no circle between modules, no module over 420 lines and no function over 70.

    python tests/unit/layout_rules.py     # prints the table and the largest modules; exit 1 on a broken rule

Imports are read from the source (ast), at any depth (lazy imports inside functions count too), so the map
is what could be imported, not what happened to be.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from pathlib import Path

from draftsmith.runtime import display

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "draftsmith"
# the floors, lowest first: runtime is the ground floor (errors, files, run locks) that every stage stands on
PACKAGES = ("runtime", "config", "models", "data", "train", "eval", "ship", "engines", "toy", "scripts")
# package -> the draftsmith packages it may import (besides itself); DESIGN.md section 2
ALLOWED = {
    "runtime": set(),
    "config": {"runtime"},
    "models": {"runtime"},
    "data": {"runtime"},
    "train": {"runtime", "config", "models", "data"},
    "eval": {"runtime", "config", "models", "data"},
    "toy": {"runtime", "models", "data"},
    "ship": {"runtime", "models"},
    "engines": {"runtime", "config", "models", "data", "eval", "ship"},
    "scripts": {"runtime", "config", "models", "data", "train", "eval", "ship", "engines", "toy"},
}
MAX_LINES = 420  # "about 400 lines" a module; entry scripts and the CLI are held to the same bound
# A function fits on a screen: def line to last line, docstring included. ruff holds the same functions to 40
# statements, 15 branches and complexity 12 (pyproject.toml [tool.ruff.lint]); lines catch what those miss
# (long literal tables, long calls).
MAX_FUNCTION_LINES = 70


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, known: set[str]) -> str | None:
    """The draftsmith module `name` imports: itself if it is a module, else the longest known prefix (a name
    imported from a package is its __init__'s, or a submodule when one has that name)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def module_imports() -> dict[str, set[str]]:
    """Module -> the draftsmith modules it imports (relative imports resolved; `from pkg import sub` counts
    the submodule when `sub` is one), at any depth, as `imports` reads them."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    out: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            found |= {m for n in names if n.startswith("draftsmith") and (m := _resolve(n, known))}
        out[module] = found - {module}
    return out


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles between modules: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(cycles)


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:line name: N lines` for every function in src/draftsmith longer than `limit` lines."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    return found


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
        prog="python tests/unit/layout_rules.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    table = import_map()
    rows = [(p, ", ".join(sorted(table[p])) or "-", ", ".join(sorted(ALLOWED[p])) or "-") for p in PACKAGES]
    print("\n".join(display.table(["package", "imports", "allowed"], rows)))
    sizes = module_sizes()
    print(f"\n{len(sizes)} modules; the largest: " + ", ".join(f"{name} {n}" for n, name in sizes[:6]))
    cycles = [f"module import cycle: {', '.join(c)}" for c in module_cycles(module_imports())]
    problems = broken_rules(table) + oversized() + cycles + long_functions()
    for problem in problems:
        print(f"BROKEN: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
