"""The pipeline's "off" verdicts say why (the depth-1 acceptance against a drafting step's cost) and what to do,
from the evaluator's figures and from vLLM's own."""

from __future__ import annotations

from pathlib import Path

from draftsmith.scripts.pipeline_compare import results_table
from draftsmith.scripts.pipeline_serving import vllm_line


def vllm_report(speedups: dict[int, float], taus: dict[int, float]) -> dict:
    rows = [{"depth": k, "speedup_measured": s, "tau_vllm": taus[k]} for k, s in speedups.items()]
    fastest = max(speedups, key=lambda k: speedups[k])
    return {
        "engine": {"package": "vllm", "version": "0.32.0"},
        "lossless": True,
        "depth_check": {"rows": rows, "fastest_measured_depth": fastest},
    }


def test_vllm_off_gives_the_acceptance_a_step_needs():
    # depth 1: tau 1.25 (a_1 = 0.25) at 0.9x plain: a step costs 1.25 / 0.9 = 1.39 plain steps -> pays above 39 %;
    # tau is 0.139 short there (2.78 doublings: 6.9x the answers) and 0.325 at depth 2 (1.3 at 0.8x: 90x)
    line = vllm_line(vllm_report({1: 0.9, 2: 0.8}, {1: 1.25, 2: 1.3}), Path("r.json"))
    assert "off: no depth beat plain decoding; at depth 1 the draft token is accepted 25% of the time" in line
    assert (
        "costs 1.39 plain steps, so it pays above 39%: about 6.9x the target's answers it trained on" in line
    )
    on = vllm_line(vllm_report({1: 1.2, 2: 1.1}, {1: 1.5, 2: 1.6}), Path("r.json"))
    assert ": 1 (1.20x plain decoding)" in on and "accepted" not in on


def row(depth, speedups, acceptance):
    return {
        "tau": 1.2,
        "alpha": 0.1,
        "speedup": 0.8,
        "lossless": True,
        "recommended_depth": depth,
        "recommended_speedup": 1.0 if depth == 0 else max(speedups),
        "expected_speedup_by_depth": speedups,
        "acceptance_by_depth": acceptance,
    }


def test_the_quickstart_table_says_why_the_drafter_is_off():
    # depth 1: a_1 = 0.4 at 0.65x: (1 + 0.4) / 0.65 = 2.15 plain steps a step, which no acceptance repays; tau is
    # 0.75 short there and 1.01 at depth 2 (1.52 at 0.6x): 15 or more doublings, too far for a figure
    rows = [
        ("EAGLE-3 (trained)", "chain", row(0, [0.65, 0.6], [0.4, 0.3])),
        ("ngram (prompt lookup)", "chain", row(2, [1.1, 1.2], [0.3, 0.3])),
    ]
    text = results_table(rows, Path("eval.json"))
    assert text.splitlines()[-1] == (
        "EAGLE-3 is off at the evaluator's costs: at depth 1 the draft token is accepted 40% of the time, and a "
        "step that drafts and verifies it costs 2.15 plain steps, more than any acceptance repays there: serve "
        "prompt lookup (ngram), whose draft costs nothing, or measure in a serving engine, whose draft steps "
        "cost less than this loop's"
    )
    rows[0] = ("EAGLE-3 (trained)", "chain", row(1, [1.3, 1.2], [0.6, 0.5]))
    assert "is off" not in results_table(rows, Path("eval.json"))
