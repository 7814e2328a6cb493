"""The fault catalogue, `draftsmith engine-eval`: options that could only fail after the measurement, a vLLM run
that fails without --work-dir, and a plot that fails after the measurement, each driven through the `draftsmith`
command line and asserting (fault_catalogue.check_one_line) a non-zero exit, exactly one `error:` line, no
traceback, and nothing that existed before changed.

No case starts vLLM: the options are refused before the evaluator decodes or any worker runs (both replaced by
functions that fail the case if called); the failing run is a fake engine venv whose python exits like a
crashed vLLM; the plot case stands in for vLLM's two runs and its server with canned results."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fault_catalogue import check_one_line, run_case, snapshot

from draftsmith.engines import engine_eval, run_files
from draftsmith.engines.setup import MARKER, VLLM_CPU
from draftsmith.engines.vllm_engine import VllmRun
from draftsmith.scripts.cli import main as cli

FAKE_VLLM_ERROR = "ValueError: fake vLLM could not allocate its KV cache"


@dataclass
class World:
    root: Path  # hashed before and after each case
    target: Path  # the tiny toy target (2048 positions)
    data: Path  # one good prompt
    blank: Path  # documents without any text
    venv: Path  # a fake engine venv whose python fails as vLLM does (outside root)


@pytest.fixture(scope="module")
def world(tiny_toy_target, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("engine-eval-faults")
    data = root / "prompts.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Say hello."}]}) + "\n")
    blank = root / "blank.jsonl"
    blank.write_text(json.dumps({"text": "   "}) + "\n")
    (root / "a-directory").mkdir()
    (root / "a-file").write_text("not a directory\n")
    venv = tmp_path_factory.mktemp("fake-engine")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho 'INFO loading'\necho '{FAKE_VLLM_ERROR}'\nexit 1\n")
    python.chmod(0o755)
    spec = {"engine": "vllm", "package": VLLM_CPU.package, "version": VLLM_CPU.version, "cpu": True}
    (venv / MARKER).write_text(json.dumps({"spec": spec, "engine_version": VLLM_CPU.version}))
    return World(root, Path(tiny_toy_target), data, blank, venv)


def _argv(w: World, *extra: str) -> list[str]:
    return [
        *("engine-eval", "--target", str(w.target), "--drafter", "ngram", "--data", str(w.data)),
        *("--num-prompts", "1", "--max-new-tokens", "4", "--venv", str(w.venv), "--no-progress", *extra),
    ]


def _not_measured(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("measured before every option was checked")


def _no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError


# id -> (argv, the text the one error line must hold, what else the case sets up)
BEFORE_MEASURING: dict[str, tuple[Callable[[World], list[str]], str, Callable[..., None] | None]] = {
    "engine-eval-report-is-a-directory": (
        lambda w: _argv(w, "--report", str(w.root / "a-directory")),
        "is a directory; name the file to write",
        None,
    ),
    "engine-eval-report-under-a-file": (
        lambda w: _argv(w, "--report", str(w.root / "a-file" / "r.json")),
        "is a file, not a directory",
        None,
    ),
    "engine-eval-plot-without-matplotlib": (
        lambda w: _argv(w, "--concurrency", "1", "--plot", str(w.root / "curves.png")),
        "--plot needs matplotlib",
        _no_matplotlib,
    ),
    "engine-eval-plain-cache-is-a-file": (
        lambda w: _argv(w, "--plain-cache", str(w.root / "a-file")),
        "a-file is a file; name a directory",
        None,
    ),
    "engine-eval-context-length-past-positions": (
        lambda w: _argv(w, "--context-lengths", "512,4096"),
        "--context-lengths 4096: with --max-new-tokens 4 it passes the target's 2048 positions",
        None,
    ),
    "engine-eval-context-data-without-text": (
        lambda w: _argv(w, "--context-lengths", "512", "--context-data", str(w.blank)),
        "no text to build long prompts from",
        None,
    ),
}


@pytest.mark.parametrize("case", list(BEFORE_MEASURING))
def test_a_bad_option_is_one_line_before_anything_is_measured(case, world, capsys, monkeypatch):
    import draftsmith.eval.acceptance as acceptance

    monkeypatch.setattr(acceptance, "evaluate", _not_measured)
    monkeypatch.setattr(engine_eval, "run_worker", _not_measured)
    monkeypatch.setattr(engine_eval, "export_drafter", _not_measured)
    argv, expected, setup = BEFORE_MEASURING[case]
    if setup is not None:
        setup(monkeypatch)
    code, err, unchanged = run_case(argv(world), capsys, world.root)
    check_one_line(case, code, err, expected, unchanged)


def test_a_failed_vllm_run_names_logs_that_still_exist(world, capsys, monkeypatch, tmp_path):
    """Without --work-dir the logs live in a temporary directory deleted on the way out: the error names the
    copies kept under draftsmith's cache, which hold vLLM's own last words."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    code, err, unchanged = run_case(_argv(world), capsys, world.root)
    line = check_one_line("engine-eval-vllm-fails-without-work-dir", code, err, FAKE_VLLM_ERROR, unchanged)
    named = re.search(r"full log: (\S+?)\)", line)
    assert named, line
    log = Path(named.group(1))
    assert log.is_file() and FAKE_VLLM_ERROR in log.read_text()
    assert log.parent.parent == tmp_path / "cache" / run_files.KEPT_LOGS
    assert "draftsmith-engine-eval-" not in line  # not the deleted temporary directory


def test_a_failed_plot_keeps_the_report(world, capsys, monkeypatch):
    """The plot's folder turns into a file while vLLM runs (checked writable before): the report is written
    first and stays; the plot's failure is one line naming it."""
    report, plot = world.root / "out" / "report.json", world.root / "plots" / "curves.png"

    def worker(engine: Any, job: dict[str, Any], log: Path) -> VllmRun:
        outputs = [{"token_ids": [5, 6], "wall_s": 1.0, "finish_reason": "length"} for _ in job["prompts"]]
        counters = {
            "num_drafts": 1,
            "num_draft_tokens": 3,
            "num_accepted_tokens": 1,
            "accepted_per_position": [1],
        }
        return VllmRun("0.32.0", 1.0, outputs, counters)

    def server_curves(*args: Any) -> dict[str, Any]:
        plot.parent.parent.mkdir(exist_ok=True)
        plot.parent.write_text("a file where the plot's folder was to be\n")
        row = {"concurrency": 1, "plain_tokens_per_s": 10.0, "spec_tokens_per_s": 12.0, "speedup": 1.2}
        return {"concurrency": [row | {"mean_acceptance_length": 1.5}], "stops_paying": {"concurrency": None}}

    monkeypatch.setattr(engine_eval, "run_worker", worker)
    monkeypatch.setattr(engine_eval, "curves", server_curves)
    before = snapshot(world.root)
    code = cli(_argv(world, "--concurrency", "1", "--report", str(report), "--plot", str(plot)))
    err = capsys.readouterr().err
    after = snapshot(world.root)
    unchanged = all(after.get(name) == digest for name, digest in before.items())
    check_one_line(
        "engine-eval-plot-fails-after-measuring",
        code,
        err,
        f"--plot {plot}: the plot was not drawn",
        unchanged,
    )
    assert f"the report is in {report}" in err
    kept = json.loads(report.read_text())
    assert kept["curves"]["concurrency"][0]["speedup"] == 1.2 and kept["answers"] == 1
    assert kept["vllm"]["counters"]["num_drafts"] == 1 and not plot.exists()
