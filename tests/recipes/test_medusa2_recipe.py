"""Medusa-2 end to end on the `tiny` toy target: the heads-only warm-up freezes the adapter, the joint stage
moves it, and the evaluator serves the adapted target losslessly and reports its drift."""

from __future__ import annotations

from _run import run_recipe

from draftsmith.eval.acceptance import EvalArgs, evaluate

COMMON = [
    "data.max_samples=64",
    "data.max_len=160",
    "data.eval_max_samples=8",
    "draft.num_heads=2",
    "checkpoint.every=0",
    "train.max_steps=6",
]


def run_and_eval(target, out, warmup: int) -> dict:
    run_recipe(target, out, *COMMON, f"medusa2.warmup_steps={warmup}", recipe="medusa/medusa2_toy.yaml")
    return evaluate(
        EvalArgs(
            target=str(target),
            drafter=str(out / "final"),
            data="stdlib:heldout",
            num_prompts=2,
            max_new_tokens=24,
            depth=2,
            check_lossless=True,
            progress=False,
        )
    )


def test_medusa2_warmup_then_joint_training_and_drift_report(tiny_toy_target, tmp_path):
    frozen = run_and_eval(tiny_toy_target, tmp_path / "warm", warmup=6)  # heads only, the whole run
    assert frozen["adapter_drift"]["mean_kl"] == 0.0 and frozen["adapter_drift"]["greedy_changed"] == 0
    joint = run_and_eval(tiny_toy_target, tmp_path / "joint", warmup=2)
    assert joint["adapter_drift"]["mean_kl"] > 0.0
    assert joint["lossless"] is True and frozen["lossless"] is True  # against the adapted target it serves
