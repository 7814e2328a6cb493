"""`engine-eval --depths`: the depth prediction (eval/depth.py) checked against vLLM's measured speedup at several K.

The evaluator's report predicts speedup(K) from its acceptance by depth and its own decoding loop's costs. A
serving engine has other costs, so the prediction for vLLM keeps the evaluator's acceptance (tau(K), which
vLLM reproduces) and takes its costs from vLLM, measured at one depth D only, in the classic form of the
speculative-decoding speedup (Leviathan et al. 2023):

    speedup_vllm(K) = tau(K) / (1 + K * c),      c = (vLLM's seconds per step at D / its plain seconds per token - 1) / D

A step verifies K + 1 tokens at about the cost of one plain step (a forward that small is bound by reading the
weights) and drafts K tokens at c plain steps each; vLLM's seconds per step at D are tau(D) tokens at its
measured seconds per token. The prediction equals the measured speedup at D by construction, and every other
measured K checks it: |predicted - measured| / measured against --max-speedup-diff (ALGORITHMS.md 9.8).

The evaluator's own cost profile (the `speedup_evaluator_costs` column) is not used for vLLM: measured on
SmolLM2 it grew by a quarter of a step between verifying 3 and 4 tokens in transformers, where vLLM's step
cost grew evenly with K, and a prediction built on it missed vLLM by 72 % at K = 1 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from draftsmith.eval.depth import expected_tokens, recommend

from .vllm_engine import VllmRun


def draft_cost_ratio(tau_at: float, plain_tokens_per_s: float, at_tokens_per_s: float, depth: int) -> float:
    """c: one draft token's cost in plain decoding steps, from vLLM's speed at `depth` (tau(depth) tokens a
    step) and its plain speed; 0 when the measured step is no dearer than a plain one (timing noise)."""
    step = tau_at / at_tokens_per_s
    plain = 1.0 / plain_tokens_per_s
    return max(0.0, (step / plain - 1.0) / depth)


def vllm_prediction(
    acceptance: Sequence[float | None], plain_tokens_per_s: float, at_tokens_per_s: float, depth: int
) -> tuple[float, list[float]] | None:
    """`(c, speedup_vllm(K) for K = 1..(the measured depths of acceptance))`, calibrated on vLLM's speed at
    `depth` and its plain speed; None where too little was measured to calibrate."""
    measured = []
    for rate in acceptance:
        if rate is None:
            break
        measured.append(rate)
    if depth < 1 or len(measured) < depth or plain_tokens_per_s <= 0 or at_tokens_per_s <= 0:
        return None
    c = draft_cost_ratio(expected_tokens(measured, depth), plain_tokens_per_s, at_tokens_per_s, depth)
    return c, [expected_tokens(measured, k) / (1.0 + k * c) for k in range(1, len(measured) + 1)]


def depth_check(
    ours: dict[str, Any],
    plain: VllmRun,
    runs: Mapping[int, VllmRun],
    calibrated_at: int,
    tolerance: float,
) -> dict[str, Any]:
    """The report's `depth_check`: per measured K, the evaluator's tau(K) and vLLM's, the prediction for vLLM
    and vLLM's measured speedup with their relative difference; the largest difference over the depths other
    than the calibration's, whether it is within `tolerance`, and the fastest K predicted and measured."""
    own = ours.get("expected_speedup_by_depth") or []
    acceptance = ours.get("acceptance_by_depth") or []
    at = runs[calibrated_at]
    calibrated = (
        vllm_prediction(acceptance, plain.tokens_per_s, at.tokens_per_s, calibrated_at)
        if plain.tokens_per_s and at.tokens_per_s
        else None
    )
    cost, predicted = calibrated if calibrated else (None, [])
    rows = []
    for k in sorted(runs):
        run = runs[k]
        measured = run.tokens_per_s / plain.tokens_per_s if run.tokens_per_s and plain.tokens_per_s else None
        guess = predicted[k - 1] if k <= len(predicted) else None
        rel = (guess - measured) / measured if guess is not None and measured else None
        rows.append(
            {
                "depth": k,
                "tau_predicted": expected_tokens(acceptance, k) if k <= len(acceptance) else None,
                "tau_vllm": run.mean_acceptance_length,
                "speedup_predicted": guess,
                "speedup_measured": measured,
                "tokens_per_s": run.tokens_per_s,
                "relative_difference": rel,
                "speedup_evaluator_costs": own[k - 1] if k <= len(own) else None,
                "speculative_equals_plain": sum(
                    a["token_ids"] == b["token_ids"] for a, b in zip(run.outputs, plain.outputs, strict=True)
                ),
            }
        )
    checked = [r["relative_difference"] for r in rows if r["depth"] != calibrated_at]
    worst = max((abs(d) for d in checked if d is not None), default=None)
    measured_speedups = {r["depth"]: r["speedup_measured"] for r in rows if r["speedup_measured"] is not None}
    best_measured = max(measured_speedups, key=lambda k: measured_speedups[k], default=None)
    return {
        "calibrated_at": calibrated_at,
        "plain_tokens_per_s": plain.tokens_per_s,
        "draft_cost_ratio": cost,
        "rows": rows,
        "max_relative_difference": worst,
        "tolerance": tolerance,
        "within_tolerance": worst is not None and None not in checked and worst <= tolerance,
        "predicted_speedup_by_depth": predicted,
        "recommended_depth": recommend(predicted)[0] if predicted else None,
        "fastest_measured_depth": best_measured,
    }
