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

import torch
from torch import nn

from draftsmith.models.errors import run_main
from draftsmith.models.losses import medusa_loss, medusa_token_counts
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.train.core.data import DataBundle, DataConfig
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.loop import CheckpointConfig, EvalConfig, LogConfig, TrainConfig


@dataclass
class MedusaRecipe:
    """Everything a Medusa-1 run needs; YAML recipes under recipes/medusa/ mirror it."""

    output_dir: str = field(
        default="runs/medusa", metadata={"help": "Run directory (checkpoints, metrics, final/)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed for initialisation, data split and order."})
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: MedusaConfig = field(default_factory=MedusaConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


RECIPE = MedusaRecipe  # the config tree of this method, for tools such as `draftsmith data inspect`


class MedusaMethod:
    """The loop's view of Medusa: heads over the frozen target's `final` features."""

    def __init__(self, target: FrozenTarget, heads: MedusaHeads):
        self.target = target
        self.model: nn.Module = heads
        k = heads.config.num_heads
        self.term_names = [f"depth{i}" for i in range(1, k + 1)]
        self.term_weights = heads.config.loss_weights()

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return medusa_token_counts(batch["loss_mask"], len(self.term_names))

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feats, _ = self.target.forward(batch["input_ids"], batch["attention_mask"], layer_ids=("final",))
        logits = model(feats["final"])  # [K, B, T, V]
        sums, _, metrics = medusa_loss(logits, batch["input_ids"], batch["loss_mask"])
        return sums, metrics


def build_method(cfg: MedusaRecipe, target: FrozenTarget, data: DataBundle) -> MedusaMethod:
    heads = MedusaHeads(cfg.model, target.hidden_size, target.vocab_size)
    if cfg.model.init_from_lm_head:
        heads.init_from_lm_head(target.lm_head.weight)
    return MedusaMethod(target, heads)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        MedusaRecipe, argv, "draftsmith train medusa", __doc__ or "", build_method,
        lambda result, method: format_accuracy_table(result.eval, len(method.term_names), result.initial_eval),
    )  # fmt: skip


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
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run_main(main))
