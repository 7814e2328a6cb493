"""The end-of-training tables (EAGLE / P-EAGLE, DFlash): one cell per column, with or without held-out figures."""

from types import SimpleNamespace
from typing import Any

from draftsmith.train.core.method import LoopResult
from draftsmith.train.core.metrics import start_to_end
from draftsmith.train.dflash import DFlashMethod
from draftsmith.train.eagle import format_step_table


def test_step_table_without_evaluation_keeps_every_column() -> None:
    table = format_step_table({}, ["step0", "step1"])
    rows = table.splitlines()
    assert rows[2:] == ["| 1 | x(t+2) | - | - |", "| 2 | x(t+3) | - | - |"]
    assert all(r.count("|") == rows[0].count("|") for r in rows)


def test_step_table_reports_start_and_end() -> None:
    metrics = {"eval/step0/top1": 0.5, "eval/step0/loss": 2.0, "eval/tau_estimate": 1.5}
    start = {"eval/step0/top1": 0.1, "eval/tau_estimate": 1.1}
    table = format_step_table(metrics, ["step0", "step0_reg"], start)
    assert "| 1 | x(t+2) | 0.100 -> 0.500 | 2.000 |" in table
    assert "1.100 -> 1.500" in table
    assert "x(t+3)" not in table  # regularisation terms are not depths


def test_dflash_table_without_evaluation_shows_dashes() -> None:
    method: Any = SimpleNamespace(term_names=["depth1", "depth2"])
    table = DFlashMethod.report(method, LoopResult(step=3, last_train={}, eval={}, initial_eval={}))
    assert table.splitlines()[2:] == ["| 1 | - | - | - | - |", "| 2 | - | - | - | - |"]
    assert "nan" not in table


def test_dflash_table_reports_start_and_end() -> None:
    end = {f"eval/depth1/{k}": v for k, v in (("top1", 0.5), ("prefix", 0.4), ("alpha", 0.6), ("loss", 2.0))}
    end["eval/tau_estimate"] = 1.4
    start = {"eval/depth1/top1": 0.1}
    method: Any = SimpleNamespace(term_names=["depth1"])
    table = DFlashMethod.report(method, LoopResult(step=3, last_train={}, eval=end, initial_eval=start))
    assert "| 1 | 0.100 -> 0.500 | 0.400 | 0.600 | 2.000 |" in table
    assert table.endswith("1.400")


def test_a_report_cell_shows_start_and_end_or_a_dash() -> None:
    end, start = {"eval/depth1/top1": 0.5, "eval/depth2/top1": 0.25}, {"eval/depth1/top1": 0.1}
    assert start_to_end("eval/depth1/top1", end, start) == "0.100 -> 0.500"
    assert start_to_end("eval/depth2/top1", end, start) == "0.250"
    assert start_to_end("eval/depth3/top1", end, start) == "-"
