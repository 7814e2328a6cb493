"""DFlash end to end on the `tiny` toy target: distributed invariance, resume, learning, and the evaluator."""

from __future__ import annotations

import shutil

import pytest
from _run import SHORT, assert_runs_match, run_recipe, same_weights

from draftsmith.eval.acceptance import EvalArgs, evaluate
from draftsmith.train.core.metrics import read_metrics

RECIPE = "dflash/tiny.yaml"


@pytest.mark.slow  # per-sample blocks are unit-tested (test_dflash.py: row_seeds, sample_anchors)
def test_two_processes_match_one_process_with_accumulation(tiny_toy_target, tmp_path):
    """Blocks are drawn per sample (seeded by the step and its tokens), so the split does not change them."""
    common = ["train.max_steps=6", "checkpoint.every=0", "train.micro_batch_size=2", "eval.every=0"]
    run_recipe(
        tiny_toy_target,
        tmp_path / "ddp",
        *common,
        "train.grad_accum=1",
        nproc=2,
        method="dflash",
        recipe=RECIPE,
    )
    run_recipe(
        tiny_toy_target, tmp_path / "acc", *common, "train.grad_accum=2", method="dflash", recipe=RECIPE
    )
    assert_runs_match(tmp_path / "ddp", tmp_path / "acc", 6)


@pytest.mark.slow  # the loop's resume is proven on every family; DFlash's own part (its blocks) in test_dflash.py
def test_a_resumed_run_ends_bit_identical(tiny_toy_target, tmp_path):
    run_recipe(tiny_toy_target, tmp_path / "full", *SHORT, method="dflash", recipe=RECIPE)
    part = tmp_path / "part"
    run_recipe(tiny_toy_target, part, *SHORT, method="dflash", recipe=RECIPE)
    shutil.rmtree(part / "final")
    for name in ("checkpoint-6", "checkpoint-4"):  # back to checkpoint-2: steps 3..6 run again
        shutil.rmtree(part / name)
    run_recipe(tiny_toy_target, part, *SHORT, "--resume", method="dflash", recipe=RECIPE)
    assert same_weights(tmp_path / "full", part)


def test_dflash_learns_and_decodes_losslessly(tiny_toy_target, tmp_path):
    run_recipe(tiny_toy_target, tmp_path / "run", method="dflash", recipe=RECIPE)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in records if "eval/depth1/top1" in r]
    start, end = evals[0], evals[-1]
    assert end["eval/depth1/top1"] > 2 * start["eval/depth1/top1"] and end["eval/depth1/top1"] > 0.05
    assert end["eval/tau_estimate"] > start["eval/tau_estimate"]
    for tree, temperature in (("chain", 0.0), ("topk:2", 0.0), ("chain", 1.0)):
        report = evaluate(
            EvalArgs(
                target=str(tiny_toy_target),
                drafter=str(tmp_path / "run" / "final"),
                data="stdlib:heldout",
                num_prompts=3,
                max_new_tokens=32,
                depth=3,
                tree=tree,
                temperature=temperature,
                check_lossless=temperature == 0.0,
                progress=False,
            )
        )
        assert report["lossless"] is (True if temperature == 0.0 else None)
        assert report["tau"] >= 1.0
