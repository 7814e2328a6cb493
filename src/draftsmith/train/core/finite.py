"""The guard that keeps a NaN out of the weights: stop before an optimizer step with a non-finite loss or
gradient norm, with one line naming the step, the terms and the likely cause."""

from __future__ import annotations

import math
from typing import Any

import torch

from .settings import TrainConfig


class NonFiniteLoss(ValueError):
    """Training produced a non-finite loss or gradient; the step was not applied and nothing was saved."""


def check_finite(
    nonfinite: torch.Tensor, grad_norm: Any, step: int, term_names: list[str], train: TrainConfig
) -> None:
    """Stop training at `step` if any rank's loss term (`nonfinite [K]`, summed over ranks) or the global
    gradient norm is not finite, before the optimizer applies it: a NaN must never reach the weights, a
    checkpoint or final/. Every rank sees the same reduced values, so every rank stops together.

    Raises:
        NonFiniteLoss: one line naming the step, the loss terms and the likely cause.
    """
    bad = [name for name, n in zip(term_names, nonfinite.tolist(), strict=True) if n > 0]
    norm_bad = grad_norm is not None and not math.isfinite(float(grad_norm))
    if not bad and not norm_bad:
        return
    what = f"loss term(s) {', '.join(bad)}" if bad else f"the gradient norm ({float(grad_norm)})"
    if step == 1:
        cause = (
            "at the first step this comes from the inputs, not from training: the target's features or "
            "logits, or the drafter's initial weights, are not finite (check the target weights, "
            "target.dtype and the feature cache)"
        )
    elif train.mixed_precision == "fp16":
        cause = "fp16 overflow is likely: use train.mixed_precision=bf16 or no"
    else:
        cause = f"the updates diverged: lower train.lr (now {train.lr:g})" + (
            "" if train.max_grad_norm else " or set train.max_grad_norm=1.0"
        )
    raise NonFiniteLoss(
        f"training stopped at step {step}: {what} not finite; {cause}. The step was not applied and final/ "
        "was not written; the last checkpoint (if any) holds finite weights."
    )
