"""Train EAGLE-1 or EAGLE-3 heads on a frozen target, online (ALGORITHMS.md sections 3 and 5).

    accelerate launch train/eagle.py --config recipes/eagle/eagle3_toy.yaml target.path=DIR output_dir=OUT
    draftsmith train eagle --config recipes/eagle/eagle1_toy.yaml target.path=DIR output_dir=OUT [--resume]

`draft.version: 1|3` picks the drafter. Logged per step s (EAGLE-1: the one teacher-forced step) on training
and held-out data: loss, teacher-forced top-1 agreement with the target, and `tau_estimate` = 1 + sum over
depths d of prod_{s<d} acc_s, an ESTIMATE of the acceptance length (the evaluator measures the real one).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map, default_feature_layers, shift_left
from draftsmith.models.errors import run_main
from draftsmith.models.losses import eagle1_loss, eagle3_step_loss
from draftsmith.models.target import FrozenTarget, LayerId, TargetConfig
from draftsmith.train.core.data import DataBundle, DataConfig
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.loop import CheckpointConfig, EvalConfig, LogConfig, TrainConfig
from draftsmith.train.core.metrics import chain_tau_estimate

TAU_ESTIMATE_DEPTH = 5  # EAGLE-1 trains one step; its estimate assumes that accuracy at every depth


@dataclass
class EagleRecipe:
    """Everything an EAGLE run needs; YAML recipes under recipes/eagle/ mirror it."""

    output_dir: str = field(
        default="runs/eagle", metadata={"help": "Run directory (checkpoints, metrics, final/)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed for initialisation, noise, data split and order."})
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    draft: EagleConfig = field(default_factory=EagleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


RECIPE = EagleRecipe


def step_masks(batch: dict[str, torch.Tensor], steps: int) -> list[torch.Tensor]:
    """The loss mask of each TTT step s: column t counts when token x_{t+s} is trained (the reference code's
    mask, shifted once per step) AND position t+s+1, whose target distribution is the label, is a real
    token. The second condition is a deliberate fix: the reference trains the last columns of every
    sequence toward the zero-padded logits' uniform distribution."""
    m = batch["loss_mask"].bool()
    real = shift_left(batch["attention_mask"].bool())
    out = []
    for _ in range(steps):
        out.append(m & real)
        m, real = shift_left(m), shift_left(real)
    return out


class EagleMethod:
    """The loop's view of EAGLE: features from the frozen target, the drafter, its loss terms."""

    def __init__(self, target: FrozenTarget, draft: Eagle1Draft | Eagle3Draft):
        self.target = target
        self.model: nn.Module = draft
        self.version = draft.config.version
        if self.version == 1:
            self.term_names = ["step0_reg", "step0"]
            self.term_weights = torch.tensor([draft.config.reg_weight, draft.config.cls_weight])
        else:
            S = draft.config.ttt_steps
            self.term_names = [f"step{s}" for s in range(S)]
            self.term_weights = torch.tensor([draft.config.step_decay**s for s in range(S)])
        self.feature_layers = tuple(draft.feature_layers)

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        masks = step_masks(batch, 1 if self.version == 1 else len(self.term_names))
        counts = torch.stack([m.sum() for m in masks]).float()
        return counts.repeat(2) if self.version == 1 else counts

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        feats, target_logits = self.target.batch_features(batch, self.feature_layers, return_logits=True)
        assert target_logits is not None
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        masks = step_masks(batch, 1 if self.version == 1 else len(self.term_names))
        if self.version == 1:
            f = feats["final"]
            predicted = model(draft.input_noise(f), shift_left(ids))
            sums, _, metrics = eagle1_loss(predicted, f, draft.logits(predicted), target_logits, masks[0])
            return sums, metrics
        g = torch.cat([feats[i] for i in self.feature_layers], dim=-1)
        step_logits = model(g, ids)
        z = shift_left(target_logits)
        sums, hits = [], []
        for s, logits in enumerate(step_logits):
            loss, _, hit = eagle3_step_loss(logits, z, masks[s], draft.t2d)
            sums.append(loss)
            hits.append(hit)
            z = shift_left(z)
        return torch.stack(sums), {"top1": torch.stack(hits)}

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate`: 1 + sum_d prod_{s<d} acc_s (EAGLE-1: its one accuracy at every depth up to 5)."""
        accs = [record.get(f"{prefix}/{name}/top1") for name in self.term_names if not name.endswith("_reg")]
        if any(a is None for a in accs):
            return {}
        if self.version == 1:
            accs = accs * TAU_ESTIMATE_DEPTH
        return {f"{prefix}/tau_estimate": chain_tau_estimate(accs)}


class _Eagle3Train(Eagle3Draft):
    """EAGLE-3 whose forward is the TTT unroll, so accelerate / DDP wrap one call per step."""

    def forward(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        return self.unroll(features, input_ids)


def assistant_token_counts(dataset: object, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained (assistant) token in `dataset` (EAGLE-3's vocabulary scan)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    tokens_only = getattr(dataset, "tokens_only", None)  # an offline cache: skip decoding its features
    dataset = tokens_only() if tokens_only is not None else dataset
    for i in range(len(dataset)):  # type: ignore[arg-type]
        sample = dataset[i]  # type: ignore[index]
        ids = torch.as_tensor(sample["input_ids"])[torch.as_tensor(sample["loss_mask"]).bool()]
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def build_draft(cfg: EagleRecipe, target: FrozenTarget, train_dataset: object) -> Eagle1Draft | Eagle3Draft:
    if cfg.draft.version == 1:
        draft: Eagle1Draft | Eagle3Draft = Eagle1Draft(cfg.draft, target.model.config, target.vocab_size)
    else:
        vd = cfg.draft.draft_vocab_size or target.vocab_size
        draft = _Eagle3Train(cfg.draft, target.model.config, min(vd, target.vocab_size))
        if draft.draft_vocab_size < target.vocab_size:
            draft.set_vocab_map(
                *build_vocab_map(assistant_token_counts(train_dataset, target.vocab_size), vd)
            )
        if cfg.draft.head_init == "target":
            draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    draft.attach_target(target.embed_tokens, target.lm_head)
    return draft


def cache_layers(cfg: EagleRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold for this recipe: the feature taps, and `final` for the logits."""
    if cfg.draft.version == 1:
        return ["final"]
    taps = cfg.draft.feature_layers or default_feature_layers(target.num_layers)
    return [*(int(i) for i in taps), "final"]


def build_method(cfg: EagleRecipe, target: FrozenTarget, data: DataBundle) -> EagleMethod:
    target.check_layer_ids(cfg.draft.feature_layers or [])
    return EagleMethod(target, build_draft(cfg, target, data.train))


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        EagleRecipe, argv, "draftsmith train eagle", __doc__ or "", build_method,
        lambda result, method: format_step_table(result.eval, method.term_names, result.initial_eval),
        cache_layers=cache_layers,
    )  # fmt: skip


def format_step_table(
    metrics: dict[str, float], term_names: list[str], start: dict[str, float] | None = None
) -> str:
    """Markdown table of held-out teacher-forced top-1 per step, and the tau estimate (start -> end)."""
    start = start or {}
    rows = ["| step | predicts | top-1 | loss |", "|---|---|---|---|"]
    for s, name in enumerate(n for n in term_names if not n.endswith("_reg")):
        cells = []
        for key in ("top1", "loss"):
            k = f"eval/{name}/{key}"
            if k in metrics:
                cells.append(f"{start[k]:.3f} -> {metrics[k]:.3f}" if k in start else f"{metrics[k]:.3f}")
        rows.append(f"| {s} | x(t+{s + 2}) | " + " | ".join(cells) + " |")
    if "eval/tau_estimate" in metrics:
        begin = f"{start['eval/tau_estimate']:.3f} -> " if "eval/tau_estimate" in start else ""
        rows.append(
            f"\ntau estimate (1 + sum of products of step accuracies): {begin}{metrics['eval/tau_estimate']:.3f}"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run_main(main))
