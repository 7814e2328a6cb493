"""Which chain depth K is fastest, and whether speculation pays at all (ALGORITHMS.md 9.8).

A report's measured acceptance and costs predict the wall-clock gain of drafting K tokens per step:

    tau(K)     = 1 + sum_{k=1..K} prod_{d<=k} a_d        tokens committed per verification (bonus included)
    speedup(K) = tau(K) * c_plain / (K * c_draft + r * c_verify(K + 1) + o),    speedup(0) = 1 (plain decoding)

a_d is `acceptance_by_depth[d - 1]`, c_draft the seconds of one draft step (`draft_cost_s`), and
`verify_cost_s[K]` the seconds of one target forward over K + 1 tokens, so `verify_cost_s[0]` = c_plain is a
plain decoding step. r and o calibrate the profile to the run (`Calibration`): r scales the profile to the
run's own verification time at its depth D, o is the run's time per step outside drafting and verifying, and
c_plain is plain decoding's measured time per token where the run measured it; then speedup(D) is the run's
own measured speedup (up to the prompts' prefill) and the other depths differ by what the profile says
changes. Only measured depths are predicted: K runs from 1 to the first depth without a rate,
and no further than the cost profile reaches. The recommended depth maximizes speedup over K = 0..Kmax;
0 means speculation off (no depth beats plain decoding). Pure arithmetic on the report's JSON, so anyone
can recompute it from a saved report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftsmith.models.claims import EVALUATOR_COSTS


def predictable_depth(acceptance_by_depth: Sequence[float | None], verify_cost_s: Sequence[float]) -> int:
    """The deepest K the report can predict: the measured depths up to the first one without a rate, and at
    most the cost profile's (it must time a verification of K + 1 tokens)."""
    measured = 0
    for rate in acceptance_by_depth:
        if rate is None:
            break
        measured += 1
    return max(0, min(measured, len(verify_cost_s) - 1))


def expected_tokens(acceptance_by_depth: Sequence[float | None], depth: int) -> float:
    """tau(K): tokens one verification of a K-deep chain commits on average (the bonus or correction token
    included): 1 + sum over k <= K of the probability that depths 1..k are all accepted."""
    tau, reached = 1.0, 1.0
    for rate in acceptance_by_depth[:depth]:
        if rate is None:
            raise ValueError(
                f"acceptance_by_depth has no rate within depth {depth}: {list(acceptance_by_depth)}"
            )
        reached *= rate
        tau += reached
    return tau


def _check_costs(draft_cost_s: float, verify_cost_s: Sequence[float]) -> None:
    """One line naming a cost that cannot be a measured time."""
    if not (math.isfinite(draft_cost_s) and draft_cost_s >= 0):
        raise ValueError(f"draft_cost_s must be a finite time >= 0 seconds, got {draft_cost_s}")
    bad = [c for c in verify_cost_s if not (math.isfinite(c) and c > 0)]
    if bad:
        raise ValueError(f"verify_cost_s must be finite times > 0 seconds, got {list(verify_cost_s)}")


def expected_speedups(
    acceptance_by_depth: Sequence[float | None],
    draft_cost_s: float,
    verify_cost_s: Sequence[float],
    calibration: Calibration | None = None,
) -> list[float]:
    """speedup(K) for K = 1..Kmax (`predictable_depth`), at index K - 1: tokens per step over the step's cost,
    against plain decoding's one token per `verify_cost_s[0]` (or the measured plain cost of `calibration`)."""
    _check_costs(draft_cost_s, verify_cost_s)
    bad = [a for a in acceptance_by_depth if a is not None and not 0.0 <= a <= 1.0]
    if bad:
        raise ValueError(f"acceptance_by_depth holds rates outside 0..1: {bad}")
    cal = calibration or Calibration()
    plain = cal.plain_cost_s if cal.plain_cost_s is not None else (verify_cost_s[0] if verify_cost_s else 0.0)
    return [
        expected_tokens(acceptance_by_depth, k)
        * plain
        / (k * draft_cost_s + cal.verify_scale * verify_cost_s[k] + cal.step_overhead_s)
        for k in range(1, predictable_depth(acceptance_by_depth, verify_cost_s) + 1)
    ]


@dataclass(frozen=True)
class Calibration:
    """What the run itself measured beyond the profile, so the prediction at the run's own depth is its measured
    speedup and other depths move only by what the profile says changes:

    - `verify_scale`: the run's mean verification time per step over the profile's time for that many tokens
      (answers grow the context beyond the profile's prompt; the loop's verification does more than a forward);
    - `step_overhead_s`: the run's wall time per step not spent drafting or verifying (the loop's bookkeeping);
    - `plain_cost_s`: plain decoding's measured seconds per token (None: the profile's one-token forward)."""

    verify_scale: float = 1.0
    step_overhead_s: float = 0.0
    plain_cost_s: float | None = None

    @classmethod
    def from_report(cls, report: dict[str, Any], depth: int, verify_cost_s: Sequence[float]) -> Calibration:
        """From a chain report of `depth`: its steps' verification and wall times and, with a baseline, plain
        decoding's tokens per second. Nothing measured (no step) gives the uncalibrated profile."""
        steps = report.get("verification_forwards") or 0
        if steps == 0 or depth >= len(verify_cost_s):
            return cls()
        verify, draft = report["verify_time_s"] / steps, report["draft_time_s"] / steps
        overhead = max(0.0, report["wall_time_s"] / steps - verify - draft)
        base = report.get("baseline_tokens_per_s")
        return cls(verify / verify_cost_s[depth], overhead, 1.0 / base if base else None)


def recommend(speedups: Sequence[float]) -> tuple[int, float]:
    """`(K, speedup(K))` of the fastest depth (the shallowest of equals), or `(0, 1.0)`, speculation off, when
    no depth beats plain decoding."""
    best = max(range(len(speedups)), key=lambda i: speedups[i], default=None)
    if best is None or speedups[best] <= 1.0:
        return 0, 1.0
    return best + 1, speedups[best]


def prediction(
    acceptance_by_depth: Sequence[float | None],
    draft_cost_s: float | None,
    verify_cost_s: Sequence[float],
    calibration: Calibration | None = None,
) -> dict[str, Any]:
    """The report's depth keys: the cost profile, the calibration, speedup by depth, the recommended depth and
    its speedup. Nothing is recommended (None) when no depth can be predicted: no draft was ever made, or none
    measured."""
    speedups = (
        []
        if draft_cost_s is None
        else expected_speedups(acceptance_by_depth, draft_cost_s, verify_cost_s, calibration)
    )
    depth, speedup = recommend(speedups) if speedups else (None, None)
    return {
        "verify_cost_s": list(verify_cost_s),
        "cost_calibration": dataclasses.asdict(calibration or Calibration()),
        "expected_speedup_by_depth": speedups,
        "recommended_depth": depth,
        "recommended_speedup": speedup,
        "depth_costs": EVALUATOR_COSTS,
    }


def recalibrated(report: dict[str, Any], depth: int, baseline_tokens_per_s: float) -> dict[str, Any]:
    """A chain report's depth keys again with plain decoding measured elsewhere (a run of the same prompts that
    decoded plainly once for several drafters): the calibration's plain cost from `baseline_tokens_per_s`."""
    if report.get("verify_cost_s") is None:
        return unpredicted()
    profile = report["verify_cost_s"]
    calibration = Calibration.from_report(
        {**report, "baseline_tokens_per_s": baseline_tokens_per_s}, depth, profile
    )
    return prediction(report["acceptance_by_depth"], report["draft_cost_s"], profile, calibration)


def unpredicted() -> dict[str, Any]:
    """The depth keys of a report that predicts nothing (a tree run: the prediction is for chains)."""
    return {
        "verify_cost_s": None,
        "cost_calibration": None,
        "expected_speedup_by_depth": None,
        "recommended_depth": None,
        "recommended_speedup": None,
        "depth_costs": None,
    }


# What one doubling of the target's answers added to a drafter's tau on the published curve: SmolLM2-135M-Instruct's
# chat answers measured on MT-bench (docs/BENCHMARKS.md, "The answers' own curve": +0.050 per doubling).
PUBLISHED_TAU_PER_DOUBLING = 0.050


def answers_to_pay(taus: Sequence[float], speedups: Sequence[float]) -> float | None:
    """How many times its training answers a drafter would need for some depth to pay, on the published curve.

    At depth K a step commits tau(K) tokens at speedup(K) of plain decoding, so it costs tau(K) / speedup(K) plain
    steps, and the drafter pays there once tau(K) exceeds that. The tau still missing, over the published gain per
    doubling of the answers, is the number of doublings; the smallest factor over the depths is returned (None
    without a depth). An estimate: the published curve is one target's, on one prompt set, at depth 5."""
    factors = [
        2.0 ** ((tau / speedup - tau) / PUBLISHED_TAU_PER_DOUBLING)
        for tau, speedup in zip(taus, speedups, strict=False)
        if speedup > 0
    ]
    return min(factors) if factors else None


def off_reason(taus: Sequence[float], speedups: Sequence[float]) -> str:
    """Why speculation is off and what would turn it on. At depth 1 a step commits tau(1) = 1 + a_1 tokens at
    speedup(1) of plain decoding, so it costs tau(1) / speedup(1) plain steps and pays once a_1 exceeds that cost
    minus one; `answers_to_pay` says how many more of the target's answers would make some depth pay.
    `taus[K - 1]` and `speedups[K - 1]` are depth K's."""
    acceptance_1, cost = taus[0] - 1.0, taus[0] / speedups[0]
    why = (
        f"at depth 1 the draft token is accepted {acceptance_1:.0%} of the time, and a step that drafts and "
        f"verifies it costs {cost:.2f} plain steps"
    )
    why += (
        ", more than any acceptance repays there" if cost >= 2.0 else f", so it pays above {cost - 1.0:.0%}"
    )
    factor = answers_to_pay(taus, speedups)
    if factor is None or factor > 1000:
        return (
            f"{why}: serve prompt lookup (ngram), whose draft costs nothing, or measure in a serving engine, whose "
            "draft steps cost less than this loop's"
        )
    shown = f"{factor:.1f}x" if factor < 10 else f"{factor:.0f}x"
    return (
        f"{why}: about {shown} the target's answers it trained on would make a depth pay at the published "
        f"curve's +{PUBLISHED_TAU_PER_DOUBLING:.3f} tau per doubling (docs/BENCHMARKS.md, \"The answers' own "
        'curve"); meanwhile serve prompt lookup (ngram)'
    )


def report_off_reason(report: dict[str, Any]) -> str | None:
    """`off_reason` from an evaluator report's acceptance by depth and predicted speedups; None without them."""
    rates, speedups = report.get("acceptance_by_depth") or [], report.get("expected_speedup_by_depth") or []
    if not speedups or not rates or rates[0] is None:
        return None
    taus = [expected_tokens(rates, k) for k in range(1, len(speedups) + 1)]
    return off_reason(taus, speedups)


def verdict(report: dict[str, Any]) -> str:
    """The evaluator table's line on the recommended depth (ALGORITHMS.md 9.8); "-" for a report without the
    prediction."""
    if "expected_speedup_by_depth" not in report:
        return "-"
    depth, speedups = report.get("recommended_depth"), report.get("expected_speedup_by_depth")
    if speedups is None:
        return "- (predicted for chains only; this run drafted a tree)"
    if depth is None:
        return "- (no measured depth to predict from)"
    costs = f"by the costs of {EVALUATOR_COSTS}, not an engine's"
    if depth == 0:
        best = max(range(len(speedups)), key=lambda i: speedups[i])
        line = f"speculation off {costs}: no depth pays (best K={best + 1}: {speedups[best]:.2f}x)"
        why = report_off_reason(report)
        return line if why is None else f"{line}; {why}"
    return f"recommended depth: {depth} (expected {report['recommended_speedup']:.2f}x {costs})"
