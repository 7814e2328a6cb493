"""Train Medusa-1 heads on a frozen target (ALGORITHMS.md section 2).

    accelerate launch train/medusa.py --config recipes/medusa/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train medusa --config recipes/medusa/toy.yaml target.path=DIR output_dir=OUT [--resume]

Writes `OUT/checkpoint-<step>/` (resumable state), `OUT/metrics.jsonl`, and `OUT/final/` (the drafter
checkpoint with the held-out per-head accuracies).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.chunking import (
    LOSS_CHUNK_TOKENS,
    ChunkResult,
    chunk_positions,
    chunked_loss,
    recomputing,
    token_cross_entropy,
)
from draftsmith.models.divergences import divergence
from draftsmith.models.losses import (
    medusa_head_loss,
    medusa_hits,
    medusa_loss,
    medusa_targets,
    medusa_token_counts,
    shift_columns,
)
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.medusa2 import ADAPTER_DIR, Medusa2Config, Medusa2Model
from draftsmith.models.objectives import (
    ObjectiveConfig,
    acceptance_sum,
    chain_weights,
    masked_objective,
    per_column,
)
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import start_to_end
from draftsmith.train.core.recipe import Recipe, RecipeConfig, RecipeHead, run_dir


@dataclass
class MedusaSections(RecipeHead[MedusaConfig]):
    """Medusa's own sections, between `draft` and `train` (see train/core/recipe.py)."""

    medusa2: Medusa2Config = field(default_factory=Medusa2Config)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)


@dataclass
class MedusaRecipe(RecipeConfig[MedusaConfig], MedusaSections):
    """Everything a Medusa-1 run needs; YAML recipes under recipes/medusa/ mirror it."""

    output_dir: str = run_dir("runs/medusa")
    draft: MedusaConfig = field(default_factory=MedusaConfig)


RECIPE = MedusaRecipe  # the config tree of this method, for tools such as `draftsmith data inspect`


class MedusaMethod(TrainingMethod):
    """The loop's view of Medusa: heads over the frozen target's `final` features.

    `loss_chunk`: tokens whose logits are computed at once (see `chunked_loss`); the loss is the same for
    any value. `objective`: the per-position loss and depth weights (default: cross-entropy on the data's
    tokens, head k weighted loss_decay**k). Head k at column t predicts x_{t+k+1}; its target distribution
    is the target's at column t+k, its D-PACE chain the K heads at column t.
    """

    def __init__(
        self,
        target: FrozenTarget,
        heads: MedusaHeads,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
        objective: ObjectiveConfig | None = None,
    ):
        self.target = target
        self.model: nn.Module = heads
        k = heads.config.num_heads
        self.term_names = [f"depth{i}" for i in range(1, k + 1)]
        self.objective = objective or ObjectiveConfig()
        self.term_weights = self.objective.term_weights(heads.config.loss_weights())
        self.loss_chunk = loss_chunk

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return medusa_token_counts(batch["loss_mask"], len(self.term_names))

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats, _ = self.target.batch_features(batch, ("final",))
        trunks = model(feats["final"], project=False)  # [K, B, T, H]: the projections run per chunk
        heads: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        K = len(self.term_names)
        labels, masks = medusa_targets(batch["input_ids"], batch["loss_mask"], K)
        chunk = chunk_positions(labels.shape[1], self.loss_chunk)
        T = labels.shape[2]
        final = F.pad(feats["final"], (0, 0, 0, K))  # head k (1-based) at column t: the target's final_{t+k}
        weights = masks.float()
        if self.objective.weighting == "dpace":
            ce = torch.stack(
                [per_column(_head_ce(heads, k), (trunks[k], labels[k]), chunk) for k in range(K)]
            )
            weights = chain_weights(ce, masks, self.objective.dpace_alpha)
        per_head = [
            chunked_loss(
                _head_loss(heads, k, self.target.head, self.objective),
                (trunks[k], labels[k], masks[k], final[:, k + 1 : k + 1 + T], weights[k]),
                chunk,
                keep=masks[k],  # the head's vocabulary-sized product only where it trains
            )
            for k in range(K)
        ]
        sums = torch.cat([h[0] for h in per_head])
        return sums, {name: torch.cat([h[2][name] for h in per_head]) for name in ("top1", "top5", "alpha")}

    def report(self, result: LoopResult) -> str:
        return format_accuracy_table(result.eval, len(self.term_names), result.initial_eval)


def _head_ce(heads: MedusaHeads, k: int) -> Callable[..., torch.Tensor]:
    """Head k's (0-based) cross-entropy per column `[B, c]` on one chunk (D-PACE's confidence; no gradient)."""

    def fn(trunk: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(heads.project(trunk, k), labels)

    return fn


def _head_loss(
    heads: MedusaHeads,
    k: int,
    target_head: Callable[[torch.Tensor], torch.Tensor],
    objective: ObjectiveConfig,
) -> Callable[..., ChunkResult]:
    """Head k's (0-based) loss on one chunk: `(trunk [B, c, H], labels [B, c], mask [B, c], the target's
    final state at column t+k+1 [B, c, H], weights [B, c])` -> sums, metrics top1, top5 and alpha."""

    def fn(
        trunk: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        final: torch.Tensor,
        weights: torch.Tensor,
    ) -> ChunkResult:
        target_logits = None
        if objective.loss is not None or not recomputing():
            with torch.no_grad():
                target_logits = target_head(final)
        return head_terms(heads.project(trunk, k), target_logits, labels, mask, weights, objective)

    return fn


def head_terms(
    logits: torch.Tensor,
    target_logits: torch.Tensor | None,
    labels: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    objective: ObjectiveConfig,
) -> ChunkResult:
    """One head's objective on aligned columns `[B, c, ...]`: the classic cross-entropy (`objective.loss`
    null; `weights` used only under a non-fixed weighting) or `objective.loss` against the target's logits
    (None only while recomputing the classic loss). Metrics: top1, top5 and alpha (sum of sum_v min(p, q)
    over the mask)."""
    if objective.loss is None:
        w = None if objective.weighting == "fixed" else weights
        loss, count, metrics = medusa_head_loss(logits, labels, mask, w)
        return loss, count, {**metrics, "alpha": acceptance_sum(logits, target_logits, mask)}
    loss, alpha = masked_objective(
        objective.loss, logits, target_logits, labels, weights, mask, kappa=objective.lk_kappa
    )
    top1, top5 = medusa_hits(logits, labels, mask)
    return loss, mask.sum().float().reshape(1), {"top1": top1, "top5": top5, "alpha": alpha}


class Medusa2Method(TrainingMethod):
    """Medusa-2 (ALGORITHMS.md 2.2): term 0 is the backbone's self-distillation KL(p_original || p_adapted)
    over answer positions, terms 1..K the heads' cross-entropy weighted lambda_0 * decay**k. With another
    `objective`, the heads' target distribution is the adapted backbone's (the model that verifies them
    once served), detached."""

    def __init__(self, model: Medusa2Model, config: Medusa2Config, objective: ObjectiveConfig | None = None):
        self.model: nn.Module = model
        self.config = config
        self.objective = objective or ObjectiveConfig()
        k = model.heads.config.num_heads
        self.term_names = ["base"] + [f"depth{i}" for i in range(1, k + 1)]
        fixed = config.heads_coefficient * model.heads.config.loss_weights()
        heads = self.objective.term_weights(fixed, scale=config.heads_coefficient)
        self.term_weights = torch.cat([torch.ones(1), heads])

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        base = shift_left(batch["loss_mask"]).sum().float().reshape(1)
        return torch.cat([base, medusa_token_counts(batch["loss_mask"], len(self.term_names) - 1)])

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        adapted, heads, original = model(batch["input_ids"], batch["attention_mask"])
        m = shift_left(batch["loss_mask"]).bool()
        kl, accept = divergence(original[m], adapted[m], "fkl")  # KL(p_original || p_adapted)
        same = (adapted[m].argmax(-1) == original[m].argmax(-1)).sum().float().reshape(1)
        base = {"top1": same, "top5": same, "alpha": accept.sum().reshape(1)}
        if self.objective.loss is None and self.objective.weighting == "fixed":
            sums, _, metrics = medusa_loss(heads, batch["input_ids"], batch["loss_mask"])
            served = adapted.detach()
            _, masks = medusa_targets(batch["input_ids"], batch["loss_mask"], len(heads))
            metrics["alpha"] = torch.cat(
                [acceptance_sum(heads[k], shift_columns(served, k + 1), masks[k]) for k in range(len(heads))]
            )
        else:
            sums, metrics = self._head_terms(heads, adapted.detach(), batch)
        return torch.cat([kl.sum().reshape(1), sums]), {
            k: torch.cat([base[k], v]) for k, v in metrics.items()
        }

    def _head_terms(
        self, heads: torch.Tensor, served: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The heads' terms under a non-default objective: `heads [K, B, T, V]`, `served [B, T, V]` the
        adapted backbone's logits (no gradient)."""
        K = len(heads)
        labels, masks = medusa_targets(batch["input_ids"], batch["loss_mask"], K)
        weights = masks.float()
        if self.objective.weighting == "dpace":
            with torch.no_grad():
                ce = token_cross_entropy(heads, labels)  # [K, B, T]
            weights = chain_weights(ce, masks, self.objective.dpace_alpha)
        terms = [
            head_terms(
                heads[k], shift_columns(served, k + 1), labels[k], masks[k], weights[k], self.objective
            )
            for k in range(K)
        ]
        metrics = {name: torch.cat([t[2][name] for t in terms]) for name in ("top1", "top5", "alpha")}
        return torch.cat([t[0] for t in terms]), metrics

    @property
    def kind(self) -> str:
        return "medusa"  # the heads are what ships; the adapter travels with them (save_final)

    def report(self, result: LoopResult) -> str:
        return format_accuracy_table(result.eval, len(self.term_names) - 1, result.initial_eval)

    def save_final(
        self, out: Path, target: FrozenTarget, extra: dict[str, Any], state_dict: dict[str, Any] | None
    ) -> Path:
        """The heads, plus the adapter in `adapter/` (peft's format). Medusa-2 runs only where its parameters stay
        whole on every rank (DDP, ZeRO-1/2), so `state_dict` is None here."""
        model: Any = self.model
        final = save_drafter(
            out, model.heads, target.identity(), {**extra, "medusa2": {"adapter": ADAPTER_DIR}}
        )
        model.backbone.save_pretrained(str(final / ADAPTER_DIR))
        return final

    def param_groups(self) -> list[dict[str, Any]]:
        """The adapter at train.lr after `warmup_steps` heads-only steps; the heads at a larger rate."""
        model: Any = self.model
        return [
            {"params": model.adapter_parameters(), "start_step": self.config.warmup_steps},
            {"params": list(model.heads.parameters()), "lr_scale": self.config.heads_lr_scale},
        ]


def cache_layers(cfg: MedusaRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold: Medusa-1 heads read `final` only (their labels are the data's tokens)."""
    if cfg.medusa2.enabled:
        raise ValueError(
            "Medusa-2 trains an adapter inside the target's own layers, so it needs the live target and cannot "
            "train from an offline cache: drop data.cache (or set medusa2.enabled=false for Medusa-1 heads)"
        )
    return ["final"]


def build_method(cfg: MedusaRecipe, target: FrozenTarget, data: DataBundle) -> MedusaMethod | Medusa2Method:
    heads = MedusaHeads(cfg.draft, target.hidden_size, target.vocab_size)
    if cfg.draft.init_from_lm_head:
        heads.init_from_lm_head(target.lm_head.weight)
    if cfg.medusa2.enabled:
        return Medusa2Method(Medusa2Model(target.model, heads, cfg.medusa2), cfg.medusa2, cfg.objective)
    return MedusaMethod(target, heads, objective=cfg.objective)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(MedusaRecipe, "draftsmith train medusa", __doc__ or "", build_method, cache_layers), argv
    )


def format_accuracy_table(
    metrics: dict[str, float], num_heads: int, start: dict[str, float] | None = None
) -> str:
    """Markdown table of held-out teacher-forced accuracy per head (with the values at step 0 if known)."""
    start = start or {}
    rows = []
    for k in range(1, num_heads + 1):
        if f"eval/depth{k}/top1" in metrics:
            cells = [start_to_end(f"eval/depth{k}/{key}", metrics, start) for key in ("top1", "top5", "loss")]
            rows.append([k, f"t+{k + 1}", *cells])
    lines = table(["head", "predicts", "top-1", "top-5", "loss"], rows)
    if "eval/base/loss" in metrics:  # Medusa-2: how far the adapter moved the served distribution
        lines.append(
            f"\nMedusa-2 backbone: KL(original || adapted) {metrics['eval/base/loss']:.4f} nats/token, "
            f"greedy choice unchanged at {metrics['eval/base/top1']:.3f} of answer positions"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_main(main))
