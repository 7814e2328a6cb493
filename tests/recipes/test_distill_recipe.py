"""Draft-LM distillation end to end on the `tiny` toy target: on-policy training, a plain transformers
final/ that the evaluator loads, lossless decoding with it."""

from __future__ import annotations

import json

from _run import run_recipe

from draftsmith.eval.acceptance import EvalArgs, evaluate
from draftsmith.train.core.metrics import read_metrics


def test_distill_on_policy_learns_and_its_draft_decodes_losslessly(tiny_toy_target, tmp_path):
    run_recipe(
        tiny_toy_target,
        tmp_path / "run",
        "data.max_samples=96",
        "data.max_len=192",
        "data.eval_max_samples=16",
        "train.max_steps=10",
        "distill.on_policy=0.5",
        "distill.divergence=jsd",
        "distill.max_new_tokens=24",
        method="distill",
        recipe="distill/toy.yaml",
    )
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/jsd/accept" in r]
    assert records[-1]["eval/jsd/accept"] > records[0]["eval/jsd/accept"] + 0.02
    final = tmp_path / "run" / "final"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    assert json.loads((final / "draftsmith.json").read_text())["kind"] == "draft_lm"
    report = evaluate(
        EvalArgs(
            target=str(tiny_toy_target),
            drafter=str(final),
            data="stdlib:heldout",
            num_prompts=3,
            max_new_tokens=32,
            depth=4,
            check_lossless=True,
            progress=False,
        )
    )
    assert report["lossless"] is True and report["tau"] > 1.5
