"""Train a DFlash block drafter on a frozen target, online (docs/ALGORITHMS-BLOCK.md section 1).

    accelerate launch train/dflash.py --config recipes/dflash/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train dflash --config recipes/dflash/toy.yaml target.path=DIR output_dir=OUT [--resume]

Every step samples `draft.num_anchors` blocks per sequence (anchors whose next token is trained), drafts all
of them in one forward with the block mask, and trains slots 1..B-1 (`depth1..depth{B-1}`): cross-entropy on
the data's tokens by default, or an objective of models/objectives.py against the target's distribution
(`objective.loss`: kl, tv, lk_alpha, lk_lambda); slot k weighs exp(-(k-1)/draft.decay_gamma), or D-PACE
(`objective.weighting=dpace`). Logged per depth on training and held-out data: loss, `top1` (agreement with
the target's greedy token), `prefix` (the block is right up to this slot), `alpha` (sum_v min(p, q), the
acceptance at T=1), and `tau_estimate` = 1 + sum_k prefix_k, the teacher-forced chain acceptance (the
evaluator measures the real one).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftsmith.models.block_losses import block_slot_loss, block_targets, row_seeds, sample_anchors
from draftsmith.models.chunking import LOSS_CHUNK_TOKENS, ChunkResult, chunk_positions, chunked_loss
from draftsmith.models.dflash import DFlashConfig, DFlashDraft, default_feature_layers, pick_mask_token
from draftsmith.models.objectives import ObjectiveConfig
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import recorded, start_to_end
from draftsmith.train.core.recipe import (
    ObjectiveSection,
    Recipe,
    RecipeConfig,
    run_dir,
    seed_field,
    taps_and_final,
)

EVAL_ANCHOR_SEED = -1  # held-out batches always draw the same blocks (no training step has this seed)


@dataclass
class DFlashRecipe(RecipeConfig[DFlashConfig], ObjectiveSection[DFlashConfig]):
    """Everything a DFlash run needs; YAML recipes under recipes/dflash/ mirror it."""

    output_dir: str = run_dir("runs/dflash")
    seed: int = seed_field("Seed for initialisation, anchors, data split and order.")
    draft: DFlashConfig = field(default_factory=DFlashConfig)


RECIPE = DFlashRecipe


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """`[B-1]` exp(-(k-1)/gamma) for slots k = 1..B-1 (all 1 when gamma is 0)."""
    k = torch.arange(block_size - 1, dtype=torch.float32)
    return torch.ones_like(k) if gamma == 0 else torch.exp(-k / gamma)


class DFlashMethod(TrainingMethod):
    """The loop's view of DFlash: fused target features in, one loss term per predicted slot out.

    `loss_chunk`: block slots whose vocabulary-sized logits are computed at once (`chunked_loss` over blocks);
    the loss is the same for any value.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft: DFlashDraft,
        objective: ObjectiveConfig,
        seed: int,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
    ):
        self.target = target
        self.model: nn.Module = draft
        self.objective = objective
        self.seed = seed
        self.loss_chunk = loss_chunk
        self.block = draft.block_size
        self.num_anchors = draft.config.num_anchors
        self.term_names = [f"depth{k}" for k in range(1, self.block)]
        # fixed: DFlash's own exp(-(k-1)/draft.decay_gamma); exp_decay: objective.decay_gamma; dpace: 1 per slot,
        # the D-PACE weights apply per block inside the loss.
        self.term_weights = objective.term_weights(slot_weights(self.block, draft.config.decay_gamma))
        self.feature_layers = tuple(draft.feature_layers)

    def prepare_batch(
        self, model: nn.Module, batch: dict[str, torch.Tensor], step: int, micro_batch: int, rank: int
    ) -> dict[str, torch.Tensor]:
        """Draw this step's blocks: each sample's generator is seeded by (seed, step, the sample's tokens), so a
        resumed run, and any split over ranks and accumulation steps, draws the same blocks."""
        return self._with_anchors(batch, self.seed * 1_009 + step)

    def _with_anchors(self, batch: dict[str, torch.Tensor], base: int) -> dict[str, torch.Tensor]:
        if "anchors" in batch:
            return batch
        seeds = row_seeds(batch["input_ids"], base)
        anchors, keep = sample_anchors(batch["loss_mask"], self.num_anchors, seeds)
        return {**batch, "anchors": anchors, "anchor_keep": keep}

    def _targets(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return block_targets(
            batch["input_ids"], batch["loss_mask"], batch["anchors"], batch["anchor_keep"], self.block
        )

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = self._with_anchors(batch, EVAL_ANCHOR_SEED)
        return self._targets(batch)[1].float().sum(dim=(0, 1))

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = self._with_anchors(batch, EVAL_ANCHOR_SEED)
        ids = batch["input_ids"]
        feats, _ = self.target.batch_features(batch, tuple(dict.fromkeys((*self.feature_layers, "final"))))
        g = torch.cat([feats[i] for i in self.feature_layers], dim=-1)
        hidden = model(g, ids, batch["anchors"], batch["anchor_keep"])  # [R, N*B, H]
        R, N = batch["anchors"].shape
        slots = hidden.view(R, N, self.block, -1)[:, :, 1:]  # slot 0 (the anchor) is never trained
        labels, valid, columns = self._targets(batch)
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        fn = _slot_chunk(draft, self.target.head, feats["final"], self.objective)
        chunk = max(1, chunk_positions(R * (self.block - 1), self.loss_chunk))  # blocks per chunk
        sums, _, metrics = chunked_loss(fn, (slots, labels, valid, columns), chunk)
        return sums, metrics

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate` = 1 + sum_k (share of blocks right at every slot up to k): teacher-forced."""
        runs = recorded(record, [f"{prefix}/{name}/prefix" for name in self.term_names])
        if runs is None:
            return {}
        return {f"{prefix}/tau_estimate": 1.0 + sum(r for r in runs if math.isfinite(r))}

    def report(self, result: LoopResult) -> str:
        start, end = result.initial_eval, result.eval
        rows = []
        for k, name in enumerate(self.term_names, start=1):
            keys = ("top1", "prefix", "alpha", "loss")
            rows.append([k, *(start_to_end(f"eval/{name}/{key}", end, start) for key in keys)])
        lines = table(["depth", "top-1", "accepted prefix", "alpha", "loss"], rows)
        if "eval/tau_estimate" in end:
            lines.append(f"\ntau estimate (teacher-forced accepted prefix): {end['eval/tau_estimate']:.3f}")
        return "\n".join(lines)


def _slot_chunk(
    draft: DFlashDraft,
    head: Callable[[torch.Tensor], torch.Tensor],
    final: torch.Tensor,
    objective: ObjectiveConfig,
) -> Callable[..., ChunkResult]:
    """The loss of a chunk of blocks: `(slots [R, c, K, H], labels, valid, columns [R, c, K])` -> per-slot sums,
    with the target's logits at `columns` (the distribution over each slot's token) computed here."""
    rows = torch.arange(final.shape[0], device=final.device)[:, None, None]

    def fn(
        slots: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, columns: torch.Tensor
    ) -> ChunkResult:
        with torch.no_grad():
            target_logits = head(final[rows, columns.clamp(min=0)])
        return block_slot_loss(
            draft.logits(slots),
            labels,
            valid,
            target_logits,
            objective.loss or "ce",
            kappa=objective.lk_kappa,
            dpace_alpha=objective.dpace_alpha if objective.weighting == "dpace" else None,
        )

    return fn


def cache_layers(cfg: DFlashRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold: the fused layers, and `final` for the target's distribution."""
    count = cfg.draft.num_feature_layers or cfg.draft.num_layers
    return taps_and_final(cfg.draft.feature_layers, lambda: default_feature_layers(target.num_layers, count))


def build_draft(cfg: DFlashRecipe, target: FrozenTarget) -> DFlashDraft:
    mask = pick_mask_token(
        target.tokenizer, int(target.embed_tokens.weight.shape[0]), cfg.draft.mask_token_id
    )
    config = dataclasses.replace(cfg.draft, mask_token_id=mask)
    draft = DFlashDraft(config, target.model.config, target.vocab_size)
    # The output norm starts as the target's final norm: the frozen head then reads states at the scale it was
    # trained on (a unit norm gives logits 10x too sharp on the toy targets: initial loss 32 instead of 8).
    draft.norm.load_state_dict(target.decoder.norm.state_dict())
    draft.attach_target(target.embed_tokens, target.head)
    return draft


def build_method(cfg: DFlashRecipe, target: FrozenTarget, data: DataBundle) -> DFlashMethod:
    target.check_layer_ids(cfg.draft.feature_layers or [])
    return DFlashMethod(target, build_draft(cfg, target), cfg.objective, cfg.seed)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(DFlashRecipe, "draftsmith train dflash", __doc__ or "", build_method, cache_layers), argv
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
