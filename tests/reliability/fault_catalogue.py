"""What every fault-catalogue case asserts and records: a non-zero exit, exactly one `error:` line holding the
expected text, no traceback, and (where the case says so) nothing that existed before changed. Each outcome is
also appended to the file `DRAFTSMITH_CATALOGUE` names, which bench/reliability_table.py turns into the table in
docs/BENCHMARKS.md "Fault catalogue"."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under `root`, by relative path (compared before and after a case)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def error_lines(err: str) -> list[str]:
    """The lines of stderr that are errors: draftsmith's `error: ...` and argparse's `PROG: error: ...`."""
    return [line for line in err.splitlines() if line.startswith("error:") or ": error: " in line]


def record(case: str, code: str | int | None, err: str, unchanged: bool) -> None:
    """Append the case's outcome to the catalogue file, when one is being collected."""
    path = os.environ.get("DRAFTSMITH_CATALOGUE")
    if not path:
        return
    errors = error_lines(err)
    row = {
        "case": case,
        "exit": code,
        "error": errors[0] if errors else " ".join(err.split())[-200:],
        "unchanged": unchanged,
        "traceback": "Traceback" in err,
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def check_one_line(case: str, code: str | int | None, err: str, expected: str, unchanged: bool = True) -> str:
    """Record the case, then assert the catalogue's verdict: failed, in one line with `expected`, no
    traceback, nothing changed. Returns the error line."""
    record(case, code, err, unchanged)
    errors = error_lines(err)
    assert code not in (0, None), err
    assert "Traceback" not in err and len(errors) == 1, err
    assert expected in errors[0], errors[0]
    assert unchanged, f"{case}: a file that existed before was changed"
    return errors[0]


def run_cli(argv: list[str], capsys: Any) -> tuple[str | int | None, str]:
    """`draftsmith ARGV` in this process (the function the console script calls, so an exception that escaped
    would show as a traceback), returning its exit status (argparse's usage errors: 2) and its stderr."""
    from draftsmith.scripts.cli import main as cli

    capsys.readouterr()  # what earlier steps of the case printed is not the case's output
    try:
        code: str | int | None = cli(argv)
    except SystemExit as exit_:  # argparse's usage errors: `usage: ...` then `PROG: error: ...`, status 2
        code = exit_.code
    return code, capsys.readouterr().err


def run_case(argv: list[str], capsys: Any, root: Path) -> tuple[str | int | None, str, bool]:
    """`run_cli`, and whether every file under `root` is as it was before (nothing changed, nothing added)."""
    before = snapshot(root)
    code, err = run_cli(argv, capsys)
    return code, err, snapshot(root) == before
