"""engine-eval --depths: the depth prediction on vLLM's clock, checked against hand-computed figures."""

from __future__ import annotations

from typing import Any

import pytest

from draftsmith.engines.depth_check import (
    Schedule,
    acceptance_schedules,
    depth_check,
    ngram_schedules,
    vllm_prediction,
)
from draftsmith.engines.vllm_engine import VllmRun
from draftsmith.eval.drafters.ngram import NgramDrafter

# The evaluator's report: acceptance by depth (and its own prediction, listed beside vLLM's)
OURS: dict[str, Any] = {
    "acceptance_by_depth": [0.5, 0.4, 0.3],
    "expected_speedup_by_depth": [0.9, 0.8, 0.7],
}
TAUS = [1.5, 1.7, 1.76]  # 1 + 0.5, + 0.5 * 0.4, + 0.5 * 0.4 * 0.3
ANSWER = {"token_ids": [1, 2, 3]}


def run(tokens_per_s: float, outputs=None) -> VllmRun:
    """A vLLM run of 100 tokens at `tokens_per_s`, one answer."""
    outputs = outputs or [{"token_ids": list(range(100)), "wall_s": 100 / tokens_per_s}]
    counters = {"num_drafts": 0, "num_accepted_tokens": 0, "accepted_per_position": []}
    return VllmRun("0", 1.0, outputs, counters)


def test_the_prediction_by_hand():
    # plain: 100 tokens/s (0.01 s a token); at D = 2, tau(2) = 1.7 tokens a step at 120 tokens/s: a step takes
    # 1.7 / 120 s = 1.41667 plain steps, one to verify and 2c to draft: c = 0.41667 / 2 = 0.208333
    c = (1.7 / 120 / 0.01 - 1) / 2
    assert Schedule(1.7, 1.0, 1.0, 0.7).draft_cost(2, 120.0 / 100.0) == pytest.approx(c, rel=1e-12)
    calibrated = vllm_prediction(acceptance_schedules(OURS["acceptance_by_depth"]), 100.0, 120.0, 2)
    assert calibrated is not None
    cost, got = calibrated
    assert cost == pytest.approx(c, rel=1e-12)
    assert got == pytest.approx([t / (1 + k * c) for k, t in enumerate(TAUS, start=1)], rel=1e-12)
    assert got[1] == pytest.approx(1.2, rel=1e-12)  # the calibration depth: as measured


def test_too_little_measured_predicts_nothing_and_a_cheap_step_costs_no_draft():
    assert vllm_prediction(acceptance_schedules([0.5]), 100.0, 120.0, 2) is None  # depth 2 was never measured
    assert vllm_prediction(acceptance_schedules([0.5, None, 0.3]), 100.0, 120.0, 2) is None
    assert vllm_prediction(acceptance_schedules(OURS["acceptance_by_depth"]), 0.0, 120.0, 2) is None
    # a step measured cheaper than a plain one (noise): drafting is free, the prediction is tau itself
    assert vllm_prediction(acceptance_schedules(OURS["acceptance_by_depth"]), 100.0, 200.0, 2) == (
        0.0,
        pytest.approx(TAUS),
    )


def test_the_check_compares_every_other_depth_and_names_the_fastest():
    plain = run(100.0)
    calibrated = vllm_prediction(acceptance_schedules(OURS["acceptance_by_depth"]), 100.0, 120.0, 2)
    assert calibrated is not None
    predicted = calibrated[1]
    # depth 1 measured 10 % under the prediction, depth 3 exactly on it
    runs = {1: run(predicted[0] * 100 / 1.1), 2: run(120.0), 3: run(predicted[2] * 100)}
    check = depth_check(OURS, plain, runs, 2, 0.15)
    rows = {r["depth"]: r for r in check["rows"]}
    assert rows[1]["relative_difference"] == pytest.approx(0.1)
    assert rows[2]["relative_difference"] == pytest.approx(0.0, abs=1e-12)
    assert rows[3]["relative_difference"] == pytest.approx(0.0, abs=1e-12)
    assert check["max_relative_difference"] == pytest.approx(0.1) and check["within_tolerance"]
    assert check["draft_cost_ratio"] == pytest.approx((1.7 / 120 / 0.01 - 1) / 2)
    assert rows[3]["tau_predicted"] == pytest.approx(1.76)
    assert rows[1]["speedup_evaluator_costs"] == 0.9
    assert check["recommended_depth"] == max(range(3), key=lambda i: predicted[i]) + 1
    measured = {k: r["speedup_measured"] for k, r in rows.items()}
    assert check["fastest_measured_depth"] == max(measured, key=measured.__getitem__)
    assert not depth_check(OURS, plain, runs, 2, 0.05)["within_tolerance"]


def test_each_depth_counts_answers_equal_to_plain():
    plain = run(100.0, outputs=[{**ANSWER, "wall_s": 1.0}, {**ANSWER, "wall_s": 1.0}])
    other = [{**ANSWER, "wall_s": 1.0}, {"token_ids": [1, 2, 4], "wall_s": 1.0}]
    runs = {2: run(0, outputs=[{**ANSWER, "wall_s": 0.5}] * 2), 3: run(0, outputs=other)}
    rows = depth_check(OURS, plain, runs, 2, 0.15)["rows"]
    assert [r["speculative_equals_plain"] for r in rows] == [2, 1]


def test_the_table_marks_the_calibration_and_says_whether_the_prediction_held():
    from draftsmith.engines.engine_report import depth_markdown

    plain = run(100.0)
    calibrated = vllm_prediction(acceptance_schedules(OURS["acceptance_by_depth"]), 100.0, 120.0, 2)
    assert calibrated is not None
    predicted = calibrated[1]
    runs = {1: run(predicted[0] * 100 / 1.2), 2: run(120.0)}  # depth 1: measured 20 % under the prediction
    lines = depth_markdown(depth_check(OURS, plain, runs, 2, 0.15), answers=1)
    assert lines[3].startswith("| 1 | 1.500 |") and "+20.0 %" in lines[3]
    assert lines[4].startswith("| 2 (calibration) |")
    assert lines[-1].startswith("the depth prediction: largest difference 20.0 % (limit 15 %, MISSED)")


def test_the_table_says_why_vllm_served_no_depth_faster():
    from draftsmith.engines.engine_report import depth_markdown

    def drafted(tokens_per_s: float, drafts: int, accepted: int) -> VllmRun:
        counters = {"num_drafts": drafts, "num_accepted_tokens": accepted, "accepted_per_position": []}
        return VllmRun("0", 1.0, run(tokens_per_s).outputs, counters)

    # depth 1: tau 1.2 (20 of 100 drafts accepted) at 80 of plain's 100 tokens/s: a step costs 1.2 / 0.8 = 1.5
    # plain steps, so a drafter pays above 50 % acceptance; tau is 0.3 short: 6 doublings, 64x the answers (depth
    # 2: 1.3 at 0.7x, 0.557 short)
    runs = {1: drafted(80.0, 100, 20), 2: drafted(70.0, 100, 30)}
    lines = depth_markdown(depth_check(OURS, run(100.0), runs, 1, 0.15), answers=1)
    assert lines[-1] == (
        "speculation off in vLLM: no depth beat plain decoding; at depth 1 the draft token is accepted 20% of the "
        "time, and a step that drafts and verifies it costs 1.50 plain steps, so it pays above 50%: about 64x the "
        "target's answers it trained on would make a depth pay at the published curve's +0.050 tau per doubling "
        '(docs/BENCHMARKS.md, "The answers\' own curve"); meanwhile serve prompt lookup (ngram)'
    )
    # measured at depths 2 and 3 only: no depth-1 figure to give the reason from
    later = {2: drafted(70.0, 100, 30), 3: drafted(60.0, 100, 30)}
    assert depth_markdown(depth_check(OURS, run(100.0), later, 2, 0.15), 1)[-1] == (
        "speculation off in vLLM: no depth beat plain decoding; serve prompt lookup (ngram), or train on more of "
        "the target's answers"
    )
    runs[1] = drafted(120.0, 100, 40)
    assert "speculation off" not in depth_markdown(depth_check(OURS, run(100.0), runs, 1, 0.15), 1)[-1]


# Prompt lookup replayed by hand (vLLM's proposer: the earliest occurrence of the longest match, n 1..3), prompt
# [1, 2, 3, 4], greedy answer [1, 2, 3, 9, 1, 2]; the answer's first token comes from the prompt's forward.
#   K = 1: [1] -> draft [2], accepted 1 | [1 2 3] -> [4], 0 (the target says 9) | [9]: no match, no draft |
#          [1] -> [2], accepted 1: 5 steps, 3 with drafts, 2 accepted
#   K = 2: [1] -> [2 3], accepted 2 | [9]: no draft | [1] -> [2 3], 1 (the answer ends): 4 steps, 2 drafting, 3
PROMPT, GREEDY = [1, 2, 3, 4], [1, 2, 3, 9, 1, 2]


def test_prompt_lookup_is_replayed_step_by_step():
    proposer = NgramDrafter(max_ngram=3, min_ngram=1, match="earliest")
    got = ngram_schedules(proposer, [PROMPT], [GREEDY], [1, 2])
    assert got == {1: Schedule(6.0, 5.0, 3.0, 2.0), 2: Schedule(6.0, 4.0, 2.0, 3.0)}
    assert got[2].tau_vllm == 2.5 and got[1].tau_vllm == pytest.approx(5 / 3)
    # a draft token at c plain steps: 6 tokens in 4 steps plus 2 drafting steps of 2 draft tokens
    assert got[2].speedup(2, 0.25) == pytest.approx(6 / (4 + 2 * 2 * 0.25))
    assert got[2].draft_cost(2, got[2].speedup(2, 0.25)) == pytest.approx(0.25)
    # calibrated at K = 2 and predicted at K = 1 with the same c
    c, predicted = vllm_prediction(got, 100.0, 100.0 * got[2].speedup(2, 0.25), 2) or (None, [])
    assert c == pytest.approx(0.25) and predicted == pytest.approx([6 / (5 + 3 * 0.25), 6 / (4 + 4 * 0.25)])


def test_a_drafter_that_always_drafts_reduces_to_tau_over_its_draft_cost():
    schedules = acceptance_schedules([0.5, 0.4])
    got = schedules[2]
    assert (got.tokens, got.steps, got.drafting, got.accepted) == pytest.approx((1.7, 1.0, 1.0, 0.7))
    assert schedules[2].tau_vllm == pytest.approx(1.7)
    assert schedules[2].speedup(2, 0.1) == pytest.approx(1.7 / 1.2)
