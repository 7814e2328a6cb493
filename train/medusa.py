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

import torch
from accelerate.utils import set_seed
from torch import nn

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.errors import run_main
from draftsmith.models.losses import medusa_loss, medusa_token_counts
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.train.core.config import config_yaml
from draftsmith.train.core.config_cli import make_parser, parse_args
from draftsmith.train.core.data import DataConfig, build_datasets
from draftsmith.train.core.loop import (
    CheckpointConfig,
    EvalConfig,
    LogConfig,
    TrainConfig,
    make_accelerator,
    run_training,
)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser(MedusaRecipe, prog="draftsmith train medusa", description=__doc__ or "")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CKPT",
        help="Continue a run: from the newest checkpoint in output_dir, or from CKPT.",
    )
    cfg, args = parse_args(MedusaRecipe, parser, argv)
    output_dir = Path(cfg.output_dir)
    accelerator = make_accelerator(cfg.train, cfg.log, output_dir)
    set_seed(cfg.seed)
    target = FrozenTarget.load(cfg.target, accelerator.device)
    data = build_datasets(
        cfg.data, target.tokenizer, seed=cfg.seed, progress=accelerator.is_local_main_process
    )
    heads = MedusaHeads(cfg.model, target.hidden_size, target.vocab_size)
    if cfg.model.init_from_lm_head:
        heads.init_from_lm_head(target.lm_head.weight)
    method = MedusaMethod(target, heads.to(accelerator.device))
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    result = run_training(
        method,
        accelerator=accelerator,
        train_dataset=data.train,
        eval_dataset=data.eval,
        pad_id=pad_id,
        output_dir=output_dir,
        seed=cfg.seed,
        train=cfg.train,
        log=cfg.log,
        checkpoint=cfg.checkpoint,
        eval_cfg=cfg.eval,
        config_yaml=config_yaml(cfg),
        resume=args.resume,
    )
    if accelerator.is_main_process:
        final = save_drafter(
            output_dir / "final",
            method.model,
            target.identity(),
            extra={
                "training": {
                    "steps": result.step,
                    "heldout": result.eval,
                    "heldout_at_start": result.initial_eval,
                    "train": result.last_train,
                }
            },
        )
        print(format_accuracy_table(result.eval, len(method.term_names), result.initial_eval))
        print(f"drafter checkpoint: {final}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


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
