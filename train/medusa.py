"""Train Medusa-1 heads on a frozen target (ALGORITHMS.md section 2).

    accelerate launch train/medusa.py --config recipes/medusa/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train medusa --config recipes/medusa/toy.yaml target.path=DIR output_dir=OUT [--resume]

Writes `OUT/checkpoint-<step>/` (resumable state), `OUT/metrics.jsonl`, and `OUT/final/` (the drafter
checkpoint with the held-out per-head accuracies).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.chunking import LOSS_CHUNK_TOKENS, ChunkResult, chunk_positions, chunked_loss
from draftsmith.models.errors import run_main
from draftsmith.models.losses import (
    divergence,
    medusa_head_loss,
    medusa_loss,
    medusa_targets,
    medusa_token_counts,
)
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.medusa2 import ADAPTER_DIR, Medusa2Config, Medusa2Model
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget, LayerId, TargetConfig
from draftsmith.train.core.data import DataBundle, DataConfig
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.loop import LoopResult
from draftsmith.train.core.method import TrainingMethod
from draftsmith.train.core.recipe import Recipe
from draftsmith.train.core.settings import CheckpointConfig, EvalConfig, LogConfig, TrainConfig


@dataclass
class MedusaRecipe:
    """Everything a Medusa-1 run needs; YAML recipes under recipes/medusa/ mirror it."""

    output_dir: str = field(
        default="runs/medusa", metadata={"help": "Run directory (checkpoints, metrics, final/)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed for initialisation, data split and order."})
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    draft: MedusaConfig = field(default_factory=MedusaConfig)
    medusa2: Medusa2Config = field(default_factory=Medusa2Config)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


RECIPE = MedusaRecipe  # the config tree of this method, for tools such as `draftsmith data inspect`


class MedusaMethod(TrainingMethod):
    """The loop's view of Medusa: heads over the frozen target's `final` features.

    `loss_chunk`: tokens whose logits are computed at once (see `chunked_loss`); the loss is the same for
    any value.
    """

    def __init__(self, target: FrozenTarget, heads: MedusaHeads, loss_chunk: int = LOSS_CHUNK_TOKENS):
        self.target = target
        self.model: nn.Module = heads
        k = heads.config.num_heads
        self.term_names = [f"depth{i}" for i in range(1, k + 1)]
        self.term_weights = heads.config.loss_weights()
        self.loss_chunk = loss_chunk

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return medusa_token_counts(batch["loss_mask"], len(self.term_names))

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats, _ = self.target.batch_features(batch, ("final",))
        trunks = model(feats["final"], project=False)  # [K, B, T, H]: the projections run per chunk
        heads: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        labels, masks = medusa_targets(batch["input_ids"], batch["loss_mask"], len(self.term_names))
        chunk = chunk_positions(labels.shape[1], self.loss_chunk)
        per_head = [
            chunked_loss(_head_loss(heads, k), (trunks[k], labels[k], masks[k]), chunk)
            for k in range(len(self.term_names))
        ]
        sums = torch.cat([h[0] for h in per_head])
        return sums, {name: torch.cat([h[2][name] for h in per_head]) for name in ("top1", "top5")}

    def report(self, result: LoopResult) -> str:
        return format_accuracy_table(result.eval, len(self.term_names), result.initial_eval)


def _head_loss(heads: MedusaHeads, k: int) -> Any:
    """Head k's (0-based) loss on one chunk: `(trunk [B, c, H], labels [B, c], mask [B, c])` -> sums."""

    def fn(trunk: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> ChunkResult:
        return medusa_head_loss(heads.project(trunk, k), labels, mask)

    return fn


class Medusa2Method(TrainingMethod):
    """Medusa-2 (ALGORITHMS.md 2.2): term 0 is the backbone's self-distillation KL(p_original || p_adapted)
    over answer positions, terms 1..K the heads' cross-entropy weighted lambda_0 * decay**k."""

    def __init__(self, model: Medusa2Model, config: Medusa2Config):
        self.model: nn.Module = model
        self.config = config
        k = model.heads.config.num_heads
        self.term_names = ["base"] + [f"depth{i}" for i in range(1, k + 1)]
        self.term_weights = torch.cat(
            [torch.ones(1), config.heads_coefficient * model.heads.config.loss_weights()]
        )

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        base = shift_left(batch["loss_mask"]).sum().float().reshape(1)
        return torch.cat([base, medusa_token_counts(batch["loss_mask"], len(self.term_names) - 1)])

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        adapted, heads, original = model(batch["input_ids"], batch["attention_mask"])
        m = shift_left(batch["loss_mask"]).bool()
        kl, _ = divergence(original[m], adapted[m], "fkl")  # KL(p_original || p_adapted)
        sums, _, metrics = medusa_loss(heads, batch["input_ids"], batch["loss_mask"])
        same = (adapted[m].argmax(-1) == original[m].argmax(-1)).sum().float().reshape(1)
        return torch.cat([kl.sum().reshape(1), sums]), {k: torch.cat([same, v]) for k, v in metrics.items()}

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
        final = save_drafter(out, model.heads, target.identity(), {**extra, "medusa2": {"adapter": ADAPTER_DIR}})
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
        return Medusa2Method(Medusa2Model(target.model, heads, cfg.medusa2), cfg.medusa2)
    return MedusaMethod(target, heads)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(Recipe(MedusaRecipe, "draftsmith train medusa", __doc__ or "", build_method, cache_layers), argv)


def format_accuracy_table(
    metrics: dict[str, float], num_heads: int, start: dict[str, float] | None = None
) -> str:
    """Markdown table of held-out teacher-forced accuracy per head (with the values at step 0 if known)."""
    start = start or {}
    rows = ["| head | predicts | top-1 | top-5 | loss |", "|---|---|---|---|---|"]
    for k in range(1, num_heads + 1):
        p = f"eval/depth{k}"
        if f"{p}/top1" not in metrics:
            continue
        cells = []
        for name, fmt in (("top1", ".3f"), ("top5", ".3f"), ("loss", ".3f")):
            end = format(metrics[f"{p}/{name}"], fmt)
            cells.append(f"{format(start[f'{p}/{name}'], fmt)} -> {end}" if f"{p}/{name}" in start else end)
        rows.append(f"| {k} | t+{k + 1} | " + " | ".join(cells) + " |")
    if "eval/base/loss" in metrics:  # Medusa-2: how far the adapter moved the served distribution
        rows.append(
            f"\nMedusa-2 backbone: KL(original || adapted) {metrics['eval/base/loss']:.4f} nats/token, "
            f"greedy choice unchanged at {metrics['eval/base/top1']:.3f} of answer positions"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run_main(main))
