"""The contract between a recipe and the loop: a `TrainingMethod`, and the `LoopResult` it gets back
(DESIGN.md section 4).

A recipe subclasses it with the trainable module, one name and weight per loss term (per-depth terms are
`depth{k}`: the term of the token drafted k steps ahead), the tokens each term counts in a batch (known before
the forward) and a forward returning per-term loss sums. Every optional hook is declared here with a default
that changes nothing, so the loop calls them unconditionally and a reader sees the whole contract in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.chunking import LOSS_CHUNK_TOKENS

if TYPE_CHECKING:
    from draftsmith.models.target import FrozenTarget


@dataclass
class LoopResult:
    """What the loop gives back: entry.py writes final/ with it and prints the method's `report` of it."""

    step: int
    last_train: dict[str, float]
    eval: dict[str, float]
    initial_eval: dict[str, float]  # held-out metrics before the first step (empty when resumed)
    # The drafter's full weights gathered from FSDP / ZeRO-3 (main process), whose unwrapped module holds
    # only this rank's shards; None when the unwrapped module holds them (single, DDP, ZeRO-1/2).
    state_dict: dict[str, torch.Tensor] | None = None
    selection: dict[str, Any] | None = None  # eval.select=best: the step final/ holds and its estimate


class TrainingMethod:
    """What a recipe gives the loop. Subclasses set `model`, `term_names` and `term_weights` in `__init__`."""

    model: nn.Module  # the trainable drafter; the loop wraps it with accelerate
    term_names: list[str]  # one name per loss term, e.g. ["depth1", "depth2"]
    term_weights: torch.Tensor  # [K] weights applied to each term's token-normalised mean
    # Generates with the draft during training (on-policy distillation): each rank needs the whole draft, so
    # FSDP-sharded drafts are refused.
    generates: bool = False
    # Tokens whose vocabulary-sized logits exist at once in the method's chunked loss (`chunked_loss`); the
    # loop sets it from `train.loss_chunk_tokens`.
    loss_chunk: int = LOSS_CHUNK_TOKENS

    @property
    def kind(self) -> str:
        """The drafter kind it trains (its record in models/families.py); a plain causal LM is a `draft_lm`."""
        return str(getattr(self.model, "kind", "draft_lm"))

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Loss tokens per term `[K]`, computed from the batch alone (before any forward)."""
        raise NotImplementedError

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward `model` on `batch`: `(loss sums [K], metric sums {name: [K]})`."""
        raise NotImplementedError

    # ---- optional hooks: the defaults change nothing ----------------------------------------------------------

    def prepare_batch(
        self, model: nn.Module, batch: dict[str, torch.Tensor], step: int, micro_batch: int, rank: int
    ) -> dict[str, torch.Tensor]:
        """A training batch before `token_counts` (distillation replaces some with on-policy samples)."""
        return batch

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """Metrics computed from a reduced record (e.g. EAGLE's simulated tau); `prefix` is train or eval."""
        return {}

    def param_groups(self) -> list[dict[str, Any]]:
        """Optimizer groups: `{"params", "lr_scale"?, "start_step"?}` (a group stays at lr 0 before its start
        step: Medusa-2's heads-only warm-up)."""
        return [{"params": list(self.model.parameters())}]

    def report(self, result: LoopResult) -> str:
        """What `draftsmith train` prints at the end: the held-out metrics (start -> end)."""
        keys = sorted(k for k in result.eval if k.endswith(("/loss", "/top1", "tau_estimate")))
        return "\n".join(
            f"{k}: {result.initial_eval[k]:.4f} -> {result.eval[k]:.4f}"
            if k in result.initial_eval
            else f"{k}: {result.eval[k]:.4f}"
            for k in keys
        )

    def save_final(
        self,
        out: Path,
        target: FrozenTarget,
        extra: dict[str, Any],
        state_dict: dict[str, torch.Tensor] | None,
    ) -> Path:
        """Write `final/` (default: a draftsmith drafter checkpoint of `self.model`). `state_dict`: the weights
        gathered from FSDP / ZeRO-3, written instead of the module's own."""
        return save_drafter(out, self.model, target.identity(), extra, state_dict=state_dict)
