"""The deployment gate: each failure class, the pass line, and refusing reports not measured alike."""

from __future__ import annotations

import json

import pytest

from draftsmith.eval.gate import main
from draftsmith.scripts.cli import main as cli_main

SETTINGS = {
    "target": "t",
    "data": "d",
    "num_prompts": 20,
    "max_new_tokens": 96,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "tree": "chain",
    "depth": 5,
}


def write(tmp_path, name: str, tau: float | None, lossless: bool | None = True, **settings) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"tau": tau, "lossless": lossless, "settings": {**SETTINGS, **settings}}))
    return str(path)


def test_min_tau(tmp_path, capsys):
    assert main(["--report", write(tmp_path, "a.json", 2.0), "--min-tau", "1.5"]) == 0
    assert "PASSED: tau 2.000" in capsys.readouterr().out
    assert main(["--report", write(tmp_path, "b.json", 1.4), "--min-tau", "1.5"]) == 3
    assert "FAILED: tau 1.400 is below --min-tau 1.500" in capsys.readouterr().out


def test_regression_against_a_baseline(tmp_path, capsys):
    old = write(tmp_path, "old.json", 2.0)
    assert main(["--report", write(tmp_path, "ok.json", 1.92), "--baseline", old]) == 0  # -4% < 5%
    assert "-4.0% against the baseline's 2.000" in capsys.readouterr().out
    assert main(["--report", write(tmp_path, "bad.json", 1.88), "--baseline", old]) == 3  # -6%
    assert "fell 6.0% from the baseline's 2.000" in capsys.readouterr().out
    assert main(["--report", write(tmp_path, "bad2.json", 1.88), "--baseline", old, "--max-drop", "0.1"]) == 0


def test_a_lossy_drafter_never_passes(tmp_path, capsys):
    assert main(["--report", write(tmp_path, "a.json", 3.0, lossless=False), "--min-tau", "1.0"]) == 3
    assert "lossless check failed" in capsys.readouterr().out


def test_reports_measured_differently_are_not_compared(tmp_path, capsys):
    old = write(tmp_path, "old.json", 2.0)
    new = write(tmp_path, "new.json", 2.5, temperature=1.0)
    assert main(["--report", new, "--baseline", old]) == 2
    assert "not measured alike (temperature: 0.0 -> 1.0)" in capsys.readouterr().err


def test_usage_errors_are_one_line(tmp_path, capsys):
    assert main(["--report", write(tmp_path, "a.json", 2.0)]) == 2  # no bar given
    (tmp_path / "junk.json").write_text("{}")
    assert main(["--report", str(tmp_path / "junk.json"), "--min-tau", "1"]) == 2
    assert "is not a `draftsmith eval` report" in capsys.readouterr().err
    assert cli_main(["gate", "--report", write(tmp_path, "c.json", 1.0), "--min-tau", "2"]) == 3
    with pytest.raises(SystemExit):
        main(["--help"])
