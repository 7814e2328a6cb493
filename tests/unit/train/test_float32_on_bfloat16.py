"""Training without autocast (`train.mixed_precision=no`: a float32 drafter) beside a bfloat16 target, the
memory-saving setting on a machine without fast bfloat16 matrix units: every hidden-state method trains, and its
first loss is the float32 target's up to the bfloat16 rounding of the target's weights and features. Before
this held, EAGLE-1, MTP, DFlash and Medusa stopped on the first step with a dtype mismatch."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

from draftsmith.train.core.metrics import read_metrics

REPO = Path(__file__).resolve().parents[3]
RECIPES = {  # method -> its smallest recipe
    "medusa": "medusa/tiny.yaml",
    "eagle": "eagle/eagle1_toy.yaml",
    "mtp": "mtp/toy.yaml",
    "dflash": "dflash/tiny.yaml",
    "peagle": "peagle/tiny.yaml",
}


def first_loss(method: str, target: Path, out: Path, dtype: str) -> float:
    main = importlib.import_module(f"draftsmith.train.{method}").main
    code = main(
        [
            "--config",
            str(REPO / "recipes" / RECIPES[method]),
            f"target.path={target}",
            f"output_dir={out}",
            f"target.dtype={dtype}",
            "train.mixed_precision=no",
            "log.wandb=false",
            "data.max_samples=4",
            "data.eval_max_samples=2",
            "data.max_len=96",
            "train.max_steps=1",
            "train.micro_batch_size=2",
            "train.grad_accum=1",
            "checkpoint.every=0",
            "eval.every=0",
            "log.every=1",
        ]
    )
    assert code == 0
    return next(v for r in read_metrics(out / "metrics.jsonl") for k, v in r.items() if k == "train/loss")


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_a_float32_drafter_trains_beside_a_bfloat16_target(method, tiny_toy_target, tmp_path):
    half = first_loss(method, tiny_toy_target, tmp_path / "bf16", "bfloat16")
    full = first_loss(method, tiny_toy_target, tmp_path / "fp32", "float32")
    assert math.isfinite(half)
    assert abs(half - full) <= 0.005 * abs(full), (half, full)
