"""The standard library's own source as a chat corpus: docstring in, function body out.

Every machine that runs draftsmith has this corpus, so the toy target (toy/target.py) can be trained
without a network. Each function or method with a docstring becomes one conversation:

    user:      the `def` line(s) and the docstring, dedented to column 0
    assistant: the rest of the body, indented as it is under the dedented `def`

Held-out conversations are chosen BY MODULE (a stable hash of the dotted module name), so a held-out prompt
never comes from a file whose other functions were trained on.

The scan parses ~600 files (a few seconds); its result is cached as JSONL under `$DRAFTSMITH_CACHE`
(default `~/.cache/draftsmith`), keyed by Python version, standard-library path and `FORMAT_VERSION`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from draftsmith.runtime.files import atomic_file, user_cache

logger = logging.getLogger(__name__)

# Bump whenever the extraction rules or the record layout change: it is part of the cache key.
FORMAT_VERSION = 1
HELDOUT_PERCENT = 5  # modules whose sha1 bucket (0-99) is below this are held out
MIN_BODY_LINES = 2  # non-blank body lines; one-liners (`return x`, `pass`) teach nothing about code
MAX_BODY_CHARS = 4000  # long bodies would dominate the token budget of a toy model
# Directories that hold test suites, demos, GUIs or third-party code rather than library source.
SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "turtledemo",
        "__phello__",
        "__pycache__",
        "pydoc_data",
        "ensurepip",
    }
)

Split = Literal["train", "heldout", "all"]


def stdlib_path() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def module_split(module: str) -> Literal["train", "heldout"]:
    """Which split a dotted module name belongs to (stable across runs, machines and Python versions)."""
    bucket = int(hashlib.sha1(module.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def stdlib_conversations(split: Split = "train", cache: Path | None = None) -> list[dict[str, Any]]:
    """The standard library's functions as conversations.

    Args:
        split: "train", "heldout" (about 5% of modules) or "all".
        cache: directory for the JSONL cache; defaults to `user_cache()`.

    Returns:
        Records `{"id": "module.Qual.name", "module": "module", "messages": [user, assistant]}` in a
        deterministic order (sorted file paths, then source order). A name defined twice in one module
        (property setters, platform branches) gets `#2`, `#3`, ... appended so ids are unique.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split={split!r} is not one of 'train', 'heldout', 'all'")
    records = _load_or_build(cache if cache is not None else user_cache())
    if split == "all":
        return records
    return [r for r in records if module_split(r["module"]) == split]


def stdlib_summary(cache: Path | None = None) -> dict[str, Any]:
    """Counts of modules, conversations and characters per split, plus where the corpus came from."""
    records = _load_or_build(cache if cache is not None else user_cache())
    summary: dict[str, Any] = {
        "python_version": sys.version.split()[0],
        "stdlib_path": str(stdlib_path()),
        "format_version": FORMAT_VERSION,
    }
    for split in ("train", "heldout"):
        rows = [r for r in records if module_split(r["module"]) == split]
        summary[split] = {
            "modules": len({r["module"] for r in rows}),
            "conversations": len(rows),
            "chars": sum(len(m["content"]) for r in rows for m in r["messages"]),
        }
    return summary


def _cache_file(cache: Path) -> Path:
    root = str(stdlib_path().resolve())
    key = hashlib.sha1(f"{sys.version}|{root}|{FORMAT_VERSION}".encode()).hexdigest()[:12]
    return cache / "stdlib_corpus" / f"py{sys.version_info.major}.{sys.version_info.minor}-{key}.jsonl"


def _header() -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "python": sys.version, "stdlib": str(stdlib_path().resolve())}


def _load_or_build(cache: Path) -> list[dict[str, Any]]:
    path = _cache_file(cache)
    records = _read_cache(path)
    if records is not None:
        return records
    records = list(_scan(stdlib_path()))
    _write_cache(path, records)
    logger.info("stdlib corpus: %d conversations cached at %s", len(records), path)
    return records


def _read_cache(path: Path) -> list[dict[str, Any]] | None:
    """The cached records, or None when the file is missing, truncated, or was written for another key."""
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as f:
            header = json.loads(f.readline())
            records = [json.loads(line) for line in f]
        expected = {**_header(), "count": len(records)}
        if header != expected or not all(_well_formed(r) for r in records):
            raise ValueError(f"header {header} does not match {expected} or a record is malformed")
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        logger.warning("stdlib corpus cache %s is unusable (%s); rebuilding it", path, err)
        return None
    return records


def _well_formed(record: Any) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return False
    roles = [m.get("role") for m in record["messages"] if isinstance(m, dict)]
    return (
        isinstance(record.get("id"), str)
        and isinstance(record.get("module"), str)
        and roles
        == [
            "user",
            "assistant",
        ]
    )


def _write_cache(path: Path, records: list[dict[str, Any]]) -> None:
    """Write atomically: a reader never sees a half-written file, and a killed write leaves none."""
    try:
        with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps({**_header(), "count": len(records)}) + "\n")
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as err:
        # A read-only home must not stop training: the scan only costs a few seconds to redo.
        logger.warning("could not write the stdlib corpus cache %s (%s); continuing without it", path, err)


def _source_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every library source file, in sorted path order."""
    for dirpath, dirnames, filenames in os.walk(root):
        # Non-identifier directories (config-3.11-x86_64-linux-gnu, lib-dynload) are not packages.
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and d.isidentifier())
        rel = Path(dirpath).relative_to(root).parts
        for name in sorted(filenames):
            stem = name[:-3]
            if not name.endswith(".py") or not stem.isidentifier() or stem.startswith("test_"):
                continue
            parts = [*rel] if stem == "__init__" else [*rel, stem]
            if parts:
                yield ".".join(parts), Path(dirpath) / name


def _scan(root: Path) -> Iterator[dict[str, Any]]:
    for module, path in _source_files(root):
        try:
            # decode_source honours PEP 263 coding cookies and translates newlines to "\n", so the
            # lines below are numbered exactly as the AST numbers them.
            source = importlib.util.decode_source(path.read_bytes())
            tree = ast.parse(source, filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as err:
            logger.debug("skipping %s: %s", path, err)
            continue
        lines = source.split("\n")  # not splitlines(): it also splits on \f and \x1c, which ast does not
        seen: dict[str, int] = {}
        for qualname, node in _functions(tree, ""):
            conversation = _conversation(node, lines)
            if conversation is None:
                continue
            fid = f"{module}.{qualname}"
            seen[fid] = seen.get(fid, 0) + 1
            if seen[fid] > 1:
                fid = f"{fid}#{seen[fid]}"
            yield {"id": fid, "module": module, "messages": conversation}


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every def / async def under `node` in source order, with its dotted qualified name."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child
            yield from _functions(child, prefix + child.name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def _conversation(
    node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]
) -> list[dict[str, str]] | None:
    """User/assistant messages for one function, or None when it has no docstring or a trivial body."""
    if len(node.body) < 2 or ast.get_docstring(node, clean=False) is None:
        return None
    doc, first = node.body[0], node.body[1]
    assert doc.end_lineno is not None and node.end_lineno is not None  # set by ast.parse
    # `"""doc"""; x = 1` or a one-line def: no line boundary separates prompt from answer.
    if first.lineno <= doc.end_lineno:
        return None
    def_line = lines[node.lineno - 1]
    indent = def_line[: len(def_line) - len(def_line.lstrip())]
    prompt = _dedent(lines[node.lineno - 1 : doc.end_lineno], indent).rstrip()
    body_lines = _dedent(lines[doc.end_lineno : node.end_lineno], indent).split("\n")
    while body_lines and not body_lines[0].strip():  # blank lines between docstring and code
        body_lines.pop(0)
    body = "\n".join(body_lines).rstrip()
    if sum(1 for line in body_lines if line.strip()) < MIN_BODY_LINES or len(body) > MAX_BODY_CHARS:
        return None
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": body}]


def _dedent(lines: list[str], indent: str) -> str:
    """Remove the def's indentation from every line.

    Unlike textwrap.dedent this removes exactly the `def` line's indentation, so a docstring line that is
    indented less than the def (legal inside a string) cannot stop the code from being dedented; such a
    line loses only the whitespace it has.
    """
    width = len(indent)
    out = []
    for line in lines:
        if line.startswith(indent):
            out.append(line[width:])
        else:
            stripped = line.lstrip(" \t")
            out.append(line[min(width, len(line) - len(stripped)) :])
    return "\n".join(out)
