"""engine-eval --depths: the depth prediction moved onto vLLM's clock, checked against hand-computed figures."""

from __future__ import annotations

from typing import Any

import pytest

from draftsmith.engines.depth_check import depth_check, vllm_prediction
from draftsmith.engines.vllm_engine import VllmRun

# The evaluator's report: acceptance by depth and its cost profile (seconds)
OURS: dict[str, Any] = {
    "acceptance_by_depth": [0.5, 0.4, 0.3],
    "draft_cost_s": 0.01,
    "verify_cost_s": [0.1, 0.11, 0.12, 0.13],
    "expected_speedup_by_depth": [0.9, 0.8, 0.7],
}
ANSWER = {"token_ids": [1, 2, 3]}


def run(tokens_per_s: float, drafts: int = 0, accepted: int = 0, outputs=None) -> VllmRun:
    """A vLLM run of 100 tokens at `tokens_per_s`, one answer."""
    outputs = outputs or [{"token_ids": list(range(100)), "wall_s": 100 / tokens_per_s}]
    counters = {"num_drafts": drafts, "num_accepted_tokens": accepted, "accepted_per_position": []}
    return VllmRun("0", 1.0, outputs, counters)


def test_the_prediction_by_hand():
    # plain: 100 tokens/s, 0.01 s a token; the profile's one-token forward is 0.1 s: vLLM's clock s = 0.1.
    # At D = 2, tau(2) = 1 + 0.5 + 0.5 * 0.4 = 1.7, measured 120 tokens/s: a step takes 1.7 / 120 s, so
    # vLLM's own work per step o = 1.7 / 120 - 0.1 * (2 * 0.01 + 0.12) = 0.0001667 s.
    o = 1.7 / 120 - 0.1 * (2 * 0.01 + 0.12)
    got = vllm_prediction(OURS, run(100.0), run(120.0), 2)
    assert got is not None
    taus = [1.5, 1.7, 1.76]
    steps = [0.1 * (k * 0.01 + OURS["verify_cost_s"][k]) + o for k in (1, 2, 3)]
    assert got == pytest.approx([t * 0.01 / c for t, c in zip(taus, steps, strict=True)], rel=1e-12)
    assert got[1] == pytest.approx(1.2, rel=1e-12)  # at the calibration depth: the measured speedup


def test_too_little_measured_predicts_nothing():
    assert vllm_prediction({**OURS, "verify_cost_s": None}, run(100.0), run(120.0), 2) is None
    assert vllm_prediction({**OURS, "acceptance_by_depth": [0.5]}, run(100.0), run(120.0), 2) is None
    # vLLM far faster than the profile's shape can explain: the overhead would make a step cost <= 0
    assert vllm_prediction(OURS, run(100.0), run(1000.0), 2) is None


def test_the_check_compares_every_other_depth_and_names_the_fastest():
    plain = run(100.0)
    predicted = vllm_prediction(OURS, plain, run(120.0), 2)
    assert predicted is not None
    # depth 1 measured 10 % under the prediction, depth 3 exactly on it
    runs = {1: run(predicted[0] * 100 / 1.1), 2: run(120.0), 3: run(predicted[2] * 100)}
    check = depth_check(OURS, plain, runs, 2, 0.15)
    rows = {r["depth"]: r for r in check["rows"]}
    assert rows[1]["relative_difference"] == pytest.approx(0.1)
    assert rows[2]["relative_difference"] == pytest.approx(0.0, abs=1e-12)
    assert rows[3]["relative_difference"] == pytest.approx(0.0, abs=1e-12)
    assert check["max_relative_difference"] == pytest.approx(0.1) and check["within_tolerance"]
    assert rows[3]["tau_predicted"] == pytest.approx(1.76)
    assert rows[1]["speedup_evaluator_costs"] == 0.9
    best = max(range(3), key=lambda i: predicted[i]) + 1
    assert check["recommended_depth"] == best
    measured = {k: r["speedup_measured"] for k, r in rows.items()}
    assert check["fastest_measured_depth"] == max(measured, key=measured.__getitem__)
    assert not depth_check(OURS, plain, runs, 2, 0.05)["within_tolerance"]


def test_each_depth_counts_answers_equal_to_plain():
    plain = run(100.0, outputs=[{**ANSWER, "wall_s": 1.0}, {**ANSWER, "wall_s": 1.0}])
    other = [{**ANSWER, "wall_s": 1.0}, {"token_ids": [1, 2, 4], "wall_s": 1.0}]
    runs = {2: run(0, outputs=[{**ANSWER, "wall_s": 0.5}] * 2), 3: run(0, outputs=other)}
    rows = depth_check(OURS, plain, runs, 2, 0.15)["rows"]
    assert [r["speculative_equals_plain"] for r in rows] == [2, 1]
