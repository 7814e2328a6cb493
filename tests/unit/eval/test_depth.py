"""The fastest draft depth (eval/depth.py) against hand computations, its edge cases and invariant, the drafting
cost per depth from the decoder's steps, and the verification cost profile on a tiny target."""

from __future__ import annotations

import math
import random

import pytest

from draftsmith.eval.decoder import SpeculativeDecoder, Step
from draftsmith.eval.depth import (
    answers_to_pay,
    expected_speedups,
    expected_tokens,
    off_reason,
    predictable_depth,
    prediction,
    recommend,
    verdict,
)
from draftsmith.eval.drafters import NgramDrafter
from draftsmith.eval.report import draft_cost_per_depth
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree


def test_speedups_by_hand():
    # a = [0.5, 0.5]: tau(1) = 1 + 0.5 = 1.5, tau(2) = 1 + 0.5 + 0.25 = 1.75.
    # c_draft 0.25 s; verify 1 token 1 s (plain), 2 tokens 1 s, 3 tokens 1.25 s:
    # speedup(1) = 1.5 * 1 / (0.25 + 1) = 1.2; speedup(2) = 1.75 * 1 / (0.5 + 1.25) = 1.0.
    speedups = expected_speedups([0.5, 0.5], 0.25, [1.0, 1.0, 1.25])
    assert speedups == pytest.approx([1.2, 1.0])
    assert recommend(speedups) == (1, pytest.approx(1.2))
    # Costs in other units scale away: c_plain 2 ms, c_draft 0.5 ms, verify(2) 2.5 ms, verify(3) 3 ms:
    # speedup(1) = 1.5 * 2 / (0.5 + 2.5) = 1.0; speedup(2) = 1.75 * 2 / (1 + 3) = 0.875.
    assert expected_speedups([0.5, 0.5], 0.5e-3, [2e-3, 2.5e-3, 3e-3]) == pytest.approx([1.0, 0.875])


def test_a_deeper_chain_wins_when_acceptance_stays_high():
    # a = [0.9, 0.8, 0.5]: tau = 1.9, 2.62, 2.98; c_draft 0.1, verify [1, 1.1, 1.2, 1.3]:
    # speedup = 1.9 / 1.2, 2.62 / 1.4, 2.98 / 1.6 = 1.58333, 1.87143, 1.8625 -> K = 2.
    speedups = expected_speedups([0.9, 0.8, 0.5], 0.1, [1.0, 1.1, 1.2, 1.3])
    assert speedups == pytest.approx([1.9 / 1.2, 2.62 / 1.4, 2.98 / 1.6])
    assert recommend(speedups) == (2, pytest.approx(2.62 / 1.4))


def test_no_acceptance_switches_speculation_off():
    # Every draft rejected: tau = 1 at every depth, and every step costs more than a plain one.
    speedups = expected_speedups([0.0, 0.0], 0.1, [1.0, 1.0, 1.0])
    assert speedups == pytest.approx([1 / 1.1, 1 / 1.2])
    assert recommend(speedups) == (0, 1.0)
    report = {"expected_speedup_by_depth": speedups, "recommended_depth": 0, "recommended_speedup": 1.0}
    off = "speculation off by the costs of draftsmith's evaluator loop, not an engine's: no depth pays (best K=1: 0.91x)"
    assert verdict(report) == off  # a report without its acceptance: no reason to give
    # With it, the reason at depth 1: a step costs c_draft 0.1 + verify(2) 1.0 = 1.1 plain steps, so a drafter
    # pays above 10 % acceptance; tau is 1 at both depths, 0.1 short of paying at depth 1 (1.1) and 0.2 at depth
    # 2 (1.2): 2 and 4 doublings at +0.05 a doubling, so 4x the answers
    assert verdict({**report, "acceptance_by_depth": [0.0, 0.0]}) == (
        f"{off}; at depth 1 the draft token is accepted 0% of the time, and a step that drafts and verifies it "
        "costs 1.10 plain steps, so it pays above 10%: about 4.0x the target's answers it trained on would make a "
        "depth pay at the published curve's +0.050 tau per doubling (docs/BENCHMARKS.md, \"The answers' own "
        'curve"); meanwhile serve prompt lookup (ngram)'
    )
    # Exactly as fast as plain decoding does not pay either.
    assert recommend([1.0, 0.9]) == (0, 1.0)


def test_the_reason_for_off_is_the_cost_of_a_drafting_step_in_plain_steps():
    # a_1 = 0.3, c_draft 0.5, verify [1, 1.2]: speedup(1) = 1.3 / 1.7, so a step costs 1.7 plain steps and a
    # drafter pays above 70 % acceptance at depth 1; tau 1.3 is 0.4 short of 1.7: 8 doublings, 256x the answers
    speedup = expected_speedups([0.3], 0.5, [1.0, 1.2])[0]
    assert speedup == pytest.approx(1.3 / 1.7)
    reason = off_reason([1.3], [speedup])
    assert "accepted 30% of the time" in reason
    assert "costs 1.70 plain steps, so it pays above 70%: about 256x the target's answers" in reason
    # with depth 2 at tau 1.4 and 0.8x, 0.35 short: 7 doublings, the nearer of the two
    assert answers_to_pay([1.3, 1.4], [speedup, 0.8]) == pytest.approx(128.0)
    # a step that costs two plain steps or more (a_1 = 0.5, c_draft 1.5: 2.5): no acceptance repays it at depth 1,
    # and 1.0 of tau is 20 doublings away: not worth a figure
    reason = off_reason([1.5], [expected_speedups([0.5], 1.5, [1.0, 1.0])[0]])
    assert "costs 2.50 plain steps, more than any acceptance repays there: serve prompt lookup" in reason


def test_a_missing_rate_and_a_short_profile_limit_the_depths():
    assert predictable_depth([0.5, None, 0.9], [1.0] * 5) == 1  # depth 2 never measured: 3 cannot follow
    assert expected_speedups([0.5, None, 0.9], 0.0, [1.0] * 5) == pytest.approx([1.5])
    assert predictable_depth([0.5, 0.5, 0.5], [1.0, 1.0]) == 1  # verify(3) not timed: K = 2 unpredicted
    assert expected_speedups([0.5, 0.5, 0.5], 0.0, [1.0, 1.0]) == pytest.approx([1.5])
    assert predictable_depth([], [1.0, 1.0]) == 0 and predictable_depth([0.5], []) == 0
    assert expected_speedups([], 0.1, [1.0]) == [] and recommend([]) == (0, 1.0)
    with pytest.raises(ValueError, match="no rate within depth 2"):
        expected_tokens([0.5, None], 2)


def test_equal_speedups_recommend_the_shallower_depth():
    assert recommend([1.1, 1.3, 1.3]) == (2, 1.3)


def test_free_drafts_and_flat_verification_make_speedup_equal_tau():
    rng = random.Random(0)
    for _ in range(50):
        rates = [rng.random() for _ in range(rng.randint(1, 8))]
        cost = rng.uniform(1e-4, 1.0)
        speedups = expected_speedups(rates, 0.0, [cost] * (len(rates) + 1))
        taus = [expected_tokens(rates, k) for k in range(1, len(rates) + 1)]
        assert speedups == pytest.approx(taus)
        # Constant acceptance alpha: tau(K) = (1 - alpha^(K+1)) / (1 - alpha) (ALGORITHMS.md 9.5).
        alpha = rates[0]
        k = len(rates)
        assert expected_tokens([alpha] * k, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_costs_and_rates_that_cannot_be_measurements_are_refused():
    with pytest.raises(ValueError, match="draft_cost_s must be a finite time >= 0"):
        expected_speedups([0.5], -0.1, [1.0, 1.0])
    with pytest.raises(ValueError, match="verify_cost_s must be finite times > 0"):
        expected_speedups([0.5], 0.1, [0.0, 1.0])
    with pytest.raises(ValueError, match="verify_cost_s must be finite times > 0"):
        expected_speedups([0.5], 0.1, [1.0, math.nan])
    with pytest.raises(ValueError, match="rates outside 0..1"):
        expected_speedups([1.5], 0.1, [1.0, 1.0])


def test_the_report_keys_and_the_table_line():
    keys = prediction([0.5, 0.5], 0.25, [1.0, 1.0, 1.25])
    assert keys == {
        "verify_cost_s": [1.0, 1.0, 1.25],
        "cost_calibration": {"verify_scale": 1.0, "step_overhead_s": 0.0, "plain_cost_s": None},
        "expected_speedup_by_depth": pytest.approx([1.2, 1.0]),
        "recommended_depth": 1,
        "recommended_speedup": pytest.approx(1.2),
        "depth_costs": "draftsmith's evaluator loop",
    }
    assert verdict(keys) == (
        "recommended depth: 1 (expected 1.20x by the costs of draftsmith's evaluator loop, not an engine's)"
    )
    # No step drafted anything (an n-gram drafter that never matched): nothing to recommend, not "off".
    nothing = prediction([], None, [1.0, 1.0])
    assert nothing["recommended_depth"] is None and nothing["expected_speedup_by_depth"] == []
    assert verdict(nothing) == "- (no measured depth to predict from)"
    tree = {"expected_speedup_by_depth": None, "recommended_depth": None}
    assert verdict(tree) == "- (predicted for chains only; this run drafted a tree)"
    assert verdict({"tau": 1.0}) == "-"  # a report from before the prediction


def test_draft_cost_is_drafting_time_over_drafted_depths():
    def step(depth: int, draft_s: float) -> Step:
        return Step(depth, depth, 0, 1, 0, draft_s, 1.0)

    # 0.3 s for 3 depths, 0.1 s for 1, 0.05 s drafting nothing (an n-gram miss): 0.45 s / 4 depths.
    assert draft_cost_per_depth([step(3, 0.3), step(1, 0.1), step(0, 0.05)]) == pytest.approx(0.1125)
    # A tree's depth, not its token count: 6 nodes over depth 2 in 0.2 s is 0.1 s per depth.
    assert draft_cost_per_depth([Step(6, 2, 1, 2, 0, 0.2, 1.0)]) == pytest.approx(0.1)
    assert draft_cost_per_depth([step(0, 0.05)]) is None and draft_cost_per_depth([]) is None


def test_the_cost_profile_times_every_verification_size(tiny_random_target):
    decoder = SpeculativeDecoder(tiny_random_target, NgramDrafter(), parse_tree("chain", 3), Sampling(0.0))
    prompt = list(range(5, 45))
    costs = decoder.verify_costs(prompt, 4, repeats=2)
    assert len(costs) == 4 and all(math.isfinite(c) and c > 0 for c in costs)
    assert len(decoder.verify_costs(prompt[:2], 5, repeats=1)) == 5  # more tokens than the prompt has
    with pytest.raises(ValueError, match="max_tokens and repeats must be >= 1"):
        decoder.verify_costs(prompt, 0)


def test_the_evaluator_table_shows_speedup_by_depth_and_the_recommendation():
    from draftsmith.eval.decoder import Generation
    from draftsmith.eval.report import TurnResult, markdown, summarize

    steps = [Step(2, 2, 1, 2, 10, 0.5, 1.0), Step(2, 2, 2, 3, 12, 0.5, 1.0)]  # 1 s drafting over 4 depths
    report = summarize([TurnResult("a", 0, 10, Generation(tokens=[0] * 6, steps=steps))])
    assert report["draft_cost_s"] == pytest.approx(0.25)
    assert report["acceptance_by_depth"] == [1.0, 0.5]
    # tau(1) = 2, tau(2) = 2.5; verify [1, 1, 1.25]: speedup 2 / 1.25 = 1.6, 2.5 / 1.75 = 1.42857
    report.update(prediction(report["acceptance_by_depth"], report["draft_cost_s"], [1.0, 1.0, 1.25]))
    settings = {"drafter": "d", "tree": "chain", "depth": 2, "temperature": 0, "top_p": 1, "top_k": 0}
    table = markdown({**report, "settings": settings, "num_prompts": 1, "num_turns": 1, "lossless": None})
    assert "| expected speedup by depth (measured costs) | 1.60 1.43 |" in table
    assert (
        "| recommended depth (whose costs) | recommended depth: 1 (expected 1.60x by the costs of draftsmith's "
        "evaluator loop, not an engine's) |" in table
    )


def test_the_calibration_makes_the_runs_own_depth_its_measured_speedup():
    """Hand-computed: 10 steps at depth 2, 2.0 s verifying (0.2 s a step against the profile's 0.16: r = 1.25),
    0.5 s drafting (c_draft = 0.025 a depth), 3.0 s in all (o = 0.3 - 0.2 - 0.05 = 0.05 s a step), plain
    decoding at 20 tokens/s (0.05 s a token); a_d = 0.5, 0.5."""
    from draftsmith.eval.depth import Calibration, recalibrated

    report = {"verification_forwards": 10, "verify_time_s": 2.0, "draft_time_s": 0.5, "wall_time_s": 3.0}
    profile = [0.1, 0.12, 0.16]
    cal = Calibration.from_report({**report, "baseline_tokens_per_s": 20.0}, 2, profile)
    assert cal.verify_scale == pytest.approx(1.25) and cal.step_overhead_s == pytest.approx(0.05)
    assert cal.plain_cost_s == pytest.approx(0.05)
    speedups = expected_speedups([0.5, 0.5], 0.025, profile, cal)
    assert speedups == pytest.approx([1.5 * 0.05 / (0.025 + 1.25 * 0.12 + 0.05), 1.75 * 0.05 / 0.3])
    # at the run's own depth: tau(2) tokens per step over the run's measured seconds per step, against plain
    assert speedups[1] == pytest.approx(1.75 * (3.0 / 10) ** -1 / 20.0)
    full = {**report, "acceptance_by_depth": [0.5, 0.5], "draft_cost_s": 0.025, "verify_cost_s": profile}
    again = recalibrated(full, 2, 20.0)
    assert again["expected_speedup_by_depth"] == pytest.approx(speedups)
    assert again["cost_calibration"]["verify_scale"] == pytest.approx(1.25)
    assert Calibration.from_report({"verification_forwards": 0}, 2, profile) == Calibration()
