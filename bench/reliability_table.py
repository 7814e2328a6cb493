"""The fault catalogue as a table: every case of tests/reliability/ (bad input and faults through the command
line; a misbehaving OpenAI-compatible server for `data regenerate`; damaged GGUF files; engine-eval's and the
quickstart's inputs) and tests/recipes/test_run_safety.py (kill, resume, locks, damaged checkpoints, planted pickles), run
with pytest, then written as Markdown: case -> exit status and the one error line, with totals.

    python -m bench.reliability_table            # prints the table (about 3 minutes on 2 cores)

Feeds docs/BENCHMARKS.md, "Fault catalogue".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from draftsmith.runtime.display import table as md_table

REPO = Path(__file__).resolve().parents[1]
SUITES = ["tests/reliability", "tests/recipes/test_run_safety.py", "tests/recipes/test_mid_run_faults.py"]


def run(out: Path) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """Run the suites; returns the catalogue's per-case records and `(module, test, outcome)` of every test."""
    records, junit = out / "catalogue.jsonl", out / "junit.xml"
    env = {**os.environ, "DRAFTSMITH_CATALOGUE": str(records)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *SUITES],
        cwd=REPO,
        env=env,
        check=False,
    )
    rows = [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []
    outcomes = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = any(child.tag in ("failure", "error") for child in case)
        skipped = any(child.tag == "skipped" for child in case)
        outcome = "failed" if failed else "skipped" if skipped else "passed"
        outcomes.append((case.get("classname", ""), case.get("name", ""), outcome))
    return rows, outcomes


# The run-safety tests whose run (resumed, or run beside another writer) is compared bit for bit with the
# uninterrupted one.
RESUMING = (
    "test_resume_from",
    "test_a_damaged_checkpoint_falls",
    "test_a_second_writer",
    "test_a_partial_last",
    "test_a_kill",
    "test_a_second_training",
    "test_two_trainings",
    "test_a_disk",
    "test_a_filesystem",
)
_PORT = re.compile(r"127\.0\.0\.1:\d{4,5}")  # the fake server's port, new each run
_TMP = re.compile(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/\s]+?\d+(?=[/\s:,)]|$)")


def table(rows: list[dict], outcomes: list[tuple[str, str, str]]) -> str:
    cases = []
    for r in rows:
        line = _PORT.sub("127.0.0.1:PORT", _TMP.sub("DIR", r["error"])).replace(
            "|", "\\|"
        )  # temporary directories
        line = line if len(line) <= 140 else line[:137] + "..."
        cases.append([r["case"], r["exit"], line, "yes" if r["unchanged"] else "NO"])
    out = md_table(["case", "exit", "what the user reads (one line)", "nothing changed"], cases)
    catalogue = [(n, o) for m, n, o in outcomes if m.startswith("tests.reliability")]
    safety = [(n, o) for m, n, o in outcomes if not m.startswith("tests.reliability")]
    out += ["", *md_table(["run-safety test (a training run through the CLI)", "outcome"], safety)]
    passed = sum(o == "passed" for _, _, o in outcomes)
    resumes = [o for n, o in safety if n.startswith(RESUMING)]
    clear = sum(1 for r in rows if r["exit"] != 0 and not r["traceback"])
    out += [
        "",
        f"Totals: {len(outcomes)} tests, {passed} passed: {len(catalogue)} in tests/reliability ({len(rows)} "
        f"recorded fault cases, the rest checks of what follows a fault: the rerun, the retry, the rows kept) "
        f"and {len(safety)} run-safety tests. {clear} of {len(rows)} fault cases end in one clear line with a "
        f"non-zero exit; tracebacks: {sum(bool(r['traceback']) for r in rows)}; silent results (exit 0): "
        f"{sum(r['exit'] == 0 for r in rows)}; data changed: {sum(not r['unchanged'] for r in rows)}; runs "
        f"that must equal the uninterrupted run bit for bit: {sum(o == 'passed' for o in resumes)} of "
        f"{len(resumes)}.",
    ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m bench.reliability_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows, outcomes = run(Path(tmp))
    print(table(rows, outcomes))
    return 0 if outcomes and all(o == "passed" for _, _, o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
