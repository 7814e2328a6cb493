"""EAGLE-3 end to end on the `tiny` toy target: distributed invariance, learning, and the evaluator."""

from __future__ import annotations

import pytest
from _run import assert_runs_match, run_recipe

from draftsmith.eval.acceptance import EvalArgs, evaluate
from draftsmith.train.core.metrics import read_metrics

RECIPE = "eagle/eagle3_tiny.yaml"


def test_two_processes_match_one_process_with_accumulation(tiny_toy_target, tmp_path):
    common = ["train.max_steps=8", "checkpoint.every=0", "train.micro_batch_size=2", "eval.every=0"]
    run_recipe(
        tiny_toy_target,
        tmp_path / "ddp",
        *common,
        "train.grad_accum=1",
        nproc=2,
        method="eagle",
        recipe=RECIPE,
    )
    run_recipe(
        tiny_toy_target, tmp_path / "acc", *common, "train.grad_accum=2", method="eagle", recipe=RECIPE
    )
    assert_runs_match(tmp_path / "ddp", tmp_path / "acc", 8)  # d2t too: every rank scans the same data


def test_eagle3_learns_and_decodes_losslessly(tiny_toy_target, tmp_path):
    run_recipe(tiny_toy_target, tmp_path / "run", method="eagle", recipe=RECIPE)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    start = next(r for r in records if "eval/depth1/top1" in r)
    end = [r for r in records if "eval/depth1/top1" in r][-1]
    assert end["eval/depth1/top1"] > 3 * start["eval/depth1/top1"] and end["eval/depth1/top1"] > 0.08
    assert end["eval/tau_estimate"] > start["eval/tau_estimate"]
    for tree in ("chain", "dynamic:3:8"):
        report = evaluate(
            EvalArgs(
                target=str(tiny_toy_target),
                drafter=str(tmp_path / "run" / "final"),
                data="stdlib:heldout",
                num_prompts=3,
                max_new_tokens=32,
                depth=4,
                tree=tree,
                check_lossless=True,
                progress=False,
            )
        )
        assert report["lossless"] is True and report["tau"] > 1.0


@pytest.mark.slow  # inductor compiles the draft layer: about a minute on 2 cores
def test_a_compiled_run_matches_the_eager_one(tiny_toy_target, tmp_path):
    """`train.compile=true` (accelerate's inductor backend) trains the same drafter: the same per-step losses
    and final weights within float32 rounding of fused kernels, and final/ saved without compile's wrappers."""
    common = ["train.max_steps=6", "checkpoint.every=0", "train.micro_batch_size=2", "eval.every=0"]
    run_recipe(tiny_toy_target, tmp_path / "eager", *common, method="eagle", recipe=RECIPE)
    run_recipe(
        tiny_toy_target, tmp_path / "compiled", *common, "train.compile=true", method="eagle", recipe=RECIPE
    )
    assert_runs_match(tmp_path / "eager", tmp_path / "compiled", 6)
