"""Which drafter final/ holds: the last step's, or the one whose held-out acceptance was highest (`eval.select`).

The loss keeps falling after acceptance peaks (users report acceptance peaking at epoch 4.6 and falling after),
so with `eval.select: best` every held-out evaluation (`eval.every` steps, and the last step) ranks the drafter
by its teacher-forced `eval/tau_estimate`, the best one's weights are kept, and `final/` is written from them;
`eval.patience: N` stops the run after N evaluations without a better one. The estimate is teacher-forced on
the run's own held-out split: it ranks checkpoints of one run, it is not the evaluator's tau. A resumed run
ranks the evaluations from its resume point on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

SELECT_METRIC = "eval/tau_estimate"


@dataclass
class Selection:
    """The best held-out evaluation so far and its weights (on the CPU)."""

    select: str  # "last" or "best"
    patience: int  # evaluations without a better one before stopping (0: never)
    sharded: bool  # FSDP / ZeRO-3: gather the full weights (a collective every rank joins)
    step: int | None = None
    value: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] | None = None
    since_best: int = 0

    def offer(self, step: int, metrics: dict[str, float], model: nn.Module, accelerator: Accelerator) -> None:
        """Rank the evaluation at `step` (every rank calls this: the metrics are reduced, so all agree)."""
        if self.select != "best":
            return
        value = metrics.get(SELECT_METRIC)
        if value is None:
            raise ValueError(
                f"eval.select=best ranks held-out evaluations by {SELECT_METRIC}, which this run does not report "
                "(no held-out split, or a method without the estimate): use eval.select=last"
            )
        if self.value is not None and value <= self.value:
            self.since_best += 1
            return
        self.step, self.value, self.metrics, self.since_best = step, value, dict(metrics), 0
        self.weights = _weights(model, accelerator, self.sharded)

    @property
    def stop(self) -> bool:
        """Whether `eval.patience` evaluations in a row were no better than the best."""
        return self.select == "best" and 0 < self.patience <= self.since_best

    def restore(self, method_model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Put the best weights back for final/: into `method_model` (the unwrapped drafter) when it holds its
        parameters whole, else return them as the gathered state dict final/ is written from."""
        if self.select != "best" or self.weights is None:
            return None
        if self.sharded:
            return self.weights
        missing, unexpected = method_model.load_state_dict(self.weights, strict=False)
        if unexpected:
            raise RuntimeError(f"the kept weights do not fit the drafter: {unexpected[:3]}")
        return None

    def summary(self) -> dict[str, Any]:
        """What final/ records of the choice."""
        return {"select": self.select, "selected_step": self.step, SELECT_METRIC: self.value}


def _weights(model: nn.Module, accelerator: Accelerator, sharded: bool) -> dict[str, torch.Tensor]:
    if sharded:
        return {k: v.detach().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    return {n: p.detach().cpu().clone() for n, p in unwrapped.named_parameters() if p.requires_grad}
