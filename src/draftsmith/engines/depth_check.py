"""`engine-eval --depths`: the depth prediction (eval/depth.py) checked against vLLM's measured speedup at several K.

The evaluator's report predicts speedup(K) from its acceptance by depth and its own decoding loop's costs. A
serving engine has other costs: a faster forward, and its own work per step (scheduling, sampling, the
drafter's forward in its kernels). The prediction for vLLM keeps the evaluator's acceptance and the shape of
its cost profile and moves it onto vLLM's clock with two numbers that vLLM measured, at one depth D only:

    s = vLLM's plain seconds per token / the profile's one-token forward   (vLLM's forward against the profile's)
    o = vLLM's seconds per step at D - s * (D * c_draft + c_verify(D + 1))   (vLLM's own work per step)

where vLLM's seconds per step at D are tau(D) tokens at its measured seconds per token. Then

    speedup_vllm(K) = tau(K) * plain / (s * (K * c_draft + c_verify(K + 1)) + o)

equals the measured speedup at D by construction, and every other measured K checks it: the relative
difference |predicted - measured| / measured, against --max-speedup-diff (ALGORITHMS.md 9.8).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftsmith.eval.depth import Calibration, expected_speedups, expected_tokens, recommend

from .vllm_engine import VllmRun


def vllm_prediction(ours: dict[str, Any], plain: VllmRun, at: VllmRun, depth: int) -> list[float] | None:
    """speedup_vllm(K) for K = 1..Kmax of the evaluator's profile, calibrated on vLLM's run `at` (depth D =
    `depth`) and its plain run; None where the report or vLLM measured too little to calibrate."""
    profile, draft = ours.get("verify_cost_s"), ours.get("draft_cost_s")
    acceptance = ours.get("acceptance_by_depth") or []
    if not profile or draft is None or depth >= len(profile) or len(acceptance) < depth:
        return None
    if not plain.tokens_per_s or not at.tokens_per_s or None in acceptance[:depth]:
        return None
    plain_cost = 1.0 / plain.tokens_per_s
    scale = plain_cost / profile[0]
    step = expected_tokens(acceptance, depth) / at.tokens_per_s
    overhead = step - scale * (depth * draft + profile[depth])
    steps = [scale * (k * draft + profile[k]) + overhead for k in range(1, len(profile))]
    if min(steps) <= 0:  # vLLM drafts and verifies faster than the profile's shape allows: no prediction
        return None
    calibration = Calibration(verify_scale=scale, step_overhead_s=overhead, plain_cost_s=plain_cost)
    return expected_speedups(acceptance, draft * scale, profile, calibration)


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
    predicted = vllm_prediction(ours, plain, runs[calibrated_at], calibrated_at) or []
    own = ours.get("expected_speedup_by_depth") or []
    acceptance = ours.get("acceptance_by_depth") or []
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
        "rows": rows,
        "max_relative_difference": worst,
        "tolerance": tolerance,
        "within_tolerance": worst is not None and None not in checked and worst <= tolerance,
        "predicted_speedup_by_depth": predicted,
        "recommended_depth": recommend(predicted)[0] if predicted else None,
        "fastest_measured_depth": best_measured,
    }
