"""Train a P-EAGLE drafter on a frozen target, online (docs/ALGORITHMS-BLOCK.md section 2).

    accelerate launch train/peagle.py --config recipes/peagle/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train peagle --config recipes/peagle/toy.yaml target.path=DIR output_dir=OUT [--resume]

Every step draws each sequence's items by COD sampling (every column at depth 0, a geometrically shrinking
share of the trained columns at each deeper depth, only extending chains drawn at the depth before) and trains
all of them in ONE forward with the P-EAGLE mask. Item (a, d) learns the target's distribution of x_{a+d+2},
exactly EAGLE-3's TTT step d at column a, with EAGLE-3's loss (soft cross-entropy over the draft vocabulary,
docs/ALGORITHMS.md 5.2) or `objective.loss` (kl, ce, tv, lk_alpha, lk_lambda; docs/ALGORITHMS-BLOCK.md 3);
terms `depth{d+1}` weigh 1 or exp(-d/gamma) under `objective.weighting=exp_decay`; under `dpace` each item
weighs its D-PACE weight in its anchor's chain, the undrawn deeper items estimated from the drawn ones by their
chance of being drawn. Logged per depth on training and held-out data: loss, teacher-forced top-1 agreement
with the target, alpha (sum_v min(p, q)), and `tau_estimate`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.chunking import (
    LOSS_CHUNK_TOKENS,
    ChunkResult,
    chunk_positions,
    chunked_loss,
    recomputing,
)
from draftsmith.models.eagle3 import build_vocab_map, default_feature_layers, resolve_draft_vocab
from draftsmith.models.losses import soft_cross_entropy
from draftsmith.models.objectives import ObjectiveConfig, dpace_weights, per_column, token_objective
from draftsmith.models.parts import shift_left
from draftsmith.models.peagle import PEagleConfig, PEagleDraft, cod_sample, pick_mask_token
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import chain_tau_estimate, recorded
from draftsmith.train.core.recipe import (
    ObjectiveSection,
    Recipe,
    RecipeConfig,
    run_dir,
    seed_field,
    taps_and_final,
)
from draftsmith.train.eagle import argmax_ce, format_step_table
from draftsmith.train.eagle_vocab import assistant_token_counts

EVAL_STEP = -1  # held-out batches draw their items as if at this step: the same items at every evaluation


@dataclass
class PEagleRecipe(RecipeConfig[PEagleConfig], ObjectiveSection[PEagleConfig]):
    """Everything a P-EAGLE run needs; YAML recipes under recipes/peagle/ mirror it."""

    output_dir: str = run_dir("runs/peagle")
    seed: int = seed_field("Seed for initialisation, COD sampling, data split and order.")
    draft: PEagleConfig = field(default_factory=PEagleConfig)


RECIPE = PEagleRecipe


def trained_columns(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """`[B, T]` bool: column t trains (its depth-0 item does) iff x_t is trained and t+1 is a real token (EAGLE-3's
    step-0 mask, train/eagle.py `step_masks`)."""
    return batch["loss_mask"].bool() & shift_left(batch["attention_mask"].bool())


def row_seed(seed: int, step: int, ids: torch.Tensor) -> int:
    """A generator seed from the run's seed, the step and the row's tokens: a row draws the same items whichever
    rank or micro-batch holds it, so the split into ranks x micro-batches x accumulation does not change the run."""
    h = hashlib.sha256(f"{seed}:{step}:".encode() + ids.detach().cpu().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") & (2**63 - 1)


def batch_items(
    batch: dict[str, torch.Tensor], config: PEagleConfig, seed: int, step: int
) -> dict[str, torch.Tensor]:
    """COD items of every row, padded: `{"items_anchor", "items_depth", "items_valid", "items_inclusion"}`
    `[B, N]` (inclusion: `cod_sample`'s chance of each item being drawn, 1 on padding)."""
    trained = trained_columns(batch).cpu()
    lengths = batch["attention_mask"].sum(1).tolist()
    rows = []
    for b, S in enumerate(int(n) for n in lengths):
        gen = torch.Generator().manual_seed(row_seed(seed, step, batch["input_ids"][b, :S]))
        rows.append(
            cod_sample(trained[b, :S], config.num_depths, config.cod_ratio, config.cod_min_ratio, gen)
        )
    N = max(a.numel() for a, *_ in rows)
    device = batch["input_ids"].device
    anchors = torch.zeros(len(rows), N, dtype=torch.long)
    depths = torch.zeros_like(anchors)
    valid = torch.zeros(len(rows), N, dtype=torch.bool)
    inclusion = torch.ones(len(rows), N)
    for b, (a, d, pi) in enumerate(rows):
        n = a.numel()
        anchors[b, :n], depths[b, :n], valid[b, :n], inclusion[b, :n] = a, d, True, pi
    return {
        "items_anchor": anchors.to(device),
        "items_depth": depths.to(device),
        "items_valid": valid.to(device),
        "items_inclusion": inclusion.to(device),
    }


def item_targets(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(weights [B, N] bool, target columns [B, N])`: item (a, d) trains iff column a+d does (`trained_columns`),
    and its label is the target's distribution at column a+d+1 (the one over x_{a+d+2})."""
    anchors, depths, valid = batch["items_anchor"], batch["items_depth"], batch["items_valid"]
    T = batch["input_ids"].shape[1]
    position = (anchors + depths).clamp(max=T - 1)
    rows = torch.arange(anchors.shape[0], device=anchors.device)[:, None]
    weights = trained_columns(batch)[rows, position] & valid & (anchors + depths < T)
    return weights, (anchors + depths + 1).clamp(max=T - 1)


def item_dpace_weights(
    ce: torch.Tensor, valid: torch.Tensor, batch: dict[str, torch.Tensor], num_depths: int, alpha: float
) -> torch.Tensor:
    """D-PACE weights `[B, N]` of COD items: the chain of anchor a is its items (a, 0), (a, 1), ... (COD draws
    prefixes: an item's parent is always drawn), and `dpace_weights` with each item's `items_inclusion` stands in
    for the deeper items COD did not draw (its expectation is the weight of the whole chain).

    Args:
        ce: `[B, N]` each item's cross-entropy on its label; valid: `[B, N]` bool, the items that train.
    """
    B, N = ce.shape
    valid = valid & batch["items_valid"]
    rows = torch.arange(B, device=ce.device)[:, None].expand(B, N)[valid]
    where = (rows, batch["items_anchor"][valid], batch["items_depth"][valid])
    shape = (B, int(batch["items_anchor"].max()) + 1, num_depths)
    grid_ce = torch.zeros(shape, device=ce.device)
    grid_valid = torch.zeros(shape, dtype=torch.bool, device=ce.device)
    grid_pi = torch.ones(shape, device=ce.device)  # any positive value off the drawn items
    grid_ce[where], grid_valid[where] = ce[valid].float(), True
    grid_pi[where] = batch["items_inclusion"][valid].float()
    weights = torch.zeros(B, N, device=ce.device)
    weights[valid] = dpace_weights(grid_ce, grid_valid, alpha, grid_pi)[where]
    return weights


def depth_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    weights: torch.Tensor,
    depths: torch.Tensor,
    t2d: torch.Tensor,
    num_depths: int,
    objective: ObjectiveConfig | None = None,
    scale: torch.Tensor | None = None,
) -> ChunkResult:
    """EAGLE-3's step loss (models/losses.py `eagle3_step_loss`) of items of mixed depths, summed per depth, or
    `objective.loss` of models/objectives.py against the same distribution (`ce`: its argmax).

    Args:
        draft_logits: `[B, c, Vd]`; target_logits: `[B, c, V]` aligned with the items; weights: `[B, c]` bool;
        depths: `[B, c]`; t2d: `[V]` bool; objective: None or `loss: null` = EAGLE-3's soft cross-entropy;
        scale: None, or `[B, c]` each item's weight in the loss sums (D-PACE); the counts and metrics ignore it.

    Returns:
        `(loss sums [D], counts [D], {"top1": [D], "alpha": [D]})`: positions whose target argmax is outside the
        draft vocabulary are dropped from the loss and stay in the count; top-1 and alpha (sum_v min(p, q) over
        the draft vocabulary) are 0 while `recomputing()`.
    """
    with torch.no_grad():
        keep = t2d[target_logits.argmax(-1)]
        onehot = F.one_hot(depths, num_depths).float() * weights.float()[..., None]  # [B, c, D]
        p = torch.softmax(target_logits[..., t2d].float(), dim=-1)
    alpha = None
    if objective is None or objective.loss is None:
        ce = soft_cross_entropy(p, draft_logits)
    else:
        vd = draft_logits.shape[-1]
        ce, alpha = token_objective(
            objective.loss,
            draft_logits.reshape(-1, vd),
            target_logits[..., t2d].reshape(-1, vd),
            p.argmax(-1).reshape(-1),
            kappa=objective.lk_kappa,
        )
        ce, alpha = ce.view(keep.shape), alpha.view(keep.shape)
    if scale is not None:
        ce = ce * scale
    sums = (ce * keep.float())[..., None].mul(onehot).sum((0, 1))
    top1 = onehot.new_zeros(num_depths)
    accept = onehot.new_zeros(num_depths)
    if not recomputing():
        with torch.no_grad():
            hit = (draft_logits.argmax(-1) == p.argmax(-1)) & keep
            top1 = (hit.float()[..., None] * onehot).sum((0, 1))
            if alpha is None:
                alpha = torch.minimum(p, draft_logits.float().softmax(-1)).sum(-1)
            accept = ((alpha * keep.float())[..., None] * onehot).sum((0, 1))
    return sums, onehot.sum((0, 1)), {"top1": top1, "alpha": accept}


class PEagleMethod(TrainingMethod):
    """The loop's view of P-EAGLE: target features in, one loss term per depth out.

    `loss_chunk`: items whose vocabulary-sized logits are computed at once (`chunked_loss`); the loss is the same
    for any value.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft: PEagleDraft,
        seed: int,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
        objective: ObjectiveConfig | None = None,
    ):
        self.target, self.seed, self.loss_chunk = target, seed, loss_chunk
        self.objective = objective or ObjectiveConfig()
        self.model: nn.Module = draft
        self.config = draft.config
        D = draft.config.num_depths
        self.term_names = [f"depth{d + 1}" for d in range(D)]  # depth d drafts the token d+1 steps ahead
        self.term_weights = self.objective.term_weights(torch.ones(D))  # fixed: 1 (COD counts weight depths)
        self.feature_layers = tuple(draft.feature_layers)

    def prepare_batch(
        self, model: nn.Module, batch: dict[str, torch.Tensor], step: int, micro_batch: int, rank: int
    ) -> dict[str, torch.Tensor]:
        """Draw the COD items of this step (a resumed run draws the same ones; see `row_seed`)."""
        return {**batch, **batch_items(batch, self.config, self.seed, step)}

    def _items(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return (
            batch
            if "items_anchor" in batch
            else {**batch, **batch_items(batch, self.config, self.seed, EVAL_STEP)}
        )

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = self._items(batch)
        weights, _ = item_targets(batch)
        onehot = F.one_hot(batch["items_depth"], self.config.num_depths) * weights[..., None]
        return onehot.sum((0, 1)).float()

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = self._items(batch)
        feats, _ = self.target.batch_features(batch, tuple(dict.fromkeys((*self.feature_layers, "final"))))
        g = torch.cat([feats[i] for i in self.feature_layers], dim=-1)
        anchors, depths = batch["items_anchor"], batch["items_depth"]
        hidden = model(g, batch["input_ids"], anchors, depths, batch["items_valid"])  # [B, N, H]
        weights, columns = item_targets(batch)
        rows = torch.arange(g.shape[0], device=g.device)[:, None]
        final = feats["final"][rows, columns]  # the target's state whose logits are each item's label
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        chunk = chunk_positions(g.shape[0], self.loss_chunk)
        scale = weights.float()
        if self.objective.weighting == "dpace":  # the draft's CE on the target's argmax, one chunk at a time
            out = per_column(argmax_ce(draft, self.target.head), (hidden, final), chunk)
            valid = weights & (out[..., 1] > 0)  # an argmax outside the draft vocabulary: an untrained slot
            alpha = self.objective.dpace_alpha
            scale = item_dpace_weights(out[..., 0], valid, batch, self.config.num_depths, alpha)
        fn = _chunk_fn(draft, self.target.head, self.objective)
        sums, _, metrics = chunked_loss(fn, (hidden, final, weights, depths, scale), chunk)
        return sums, metrics

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate`: 1 + sum_d prod_{s<=d} top1_s (teacher-forced; the evaluator measures tau)."""
        accs = recorded(record, [f"{prefix}/{name}/top1" for name in self.term_names])
        if accs is None:
            return {}
        return {f"{prefix}/tau_estimate": chain_tau_estimate([float(a) for a in accs])}

    def report(self, result: LoopResult) -> str:
        return format_step_table(result.eval, self.term_names, result.initial_eval)


def _chunk_fn(
    draft: PEagleDraft, head: Callable[[torch.Tensor], torch.Tensor], objective: ObjectiveConfig
) -> Callable[..., ChunkResult]:
    """The loss of a chunk of items: `(outputs [B, c, H], target states [B, c, H], weights, depths, scale [B, c])`."""

    def fn(
        hidden: torch.Tensor,
        final: torch.Tensor,
        weights: torch.Tensor,
        depths: torch.Tensor,
        scale: torch.Tensor,
    ) -> ChunkResult:
        with torch.no_grad():
            target_logits = head(final)
        D = draft.config.num_depths
        return depth_loss(
            draft.logits(hidden), target_logits, weights, depths, draft.t2d, D, objective, scale
        )

    return fn


def resolve_mask(config: PEagleConfig, target: FrozenTarget) -> PEagleConfig:
    """`config` with the mask token and the mask embedding's mode decided (what the checkpoint records)."""
    token, dedicated = pick_mask_token(
        target.tokenizer, int(target.embed_tokens.weight.shape[0]), config.mask_token_id
    )
    mode = (
        config.mask_embedding if config.mask_embedding != "auto" else ("learned" if dedicated else "frozen")
    )
    return dataclasses.replace(config, mask_token_id=token, mask_embedding=mode)


def build_draft(cfg: PEagleRecipe, target: FrozenTarget, train_dataset: object) -> PEagleDraft:
    vd = resolve_draft_vocab(cfg.draft.draft_vocab_size, target.vocab_size)
    draft = PEagleDraft(resolve_mask(cfg.draft, target), target.model.config, vd)
    if vd < target.vocab_size:
        draft.set_vocab_map(*build_vocab_map(assistant_token_counts(train_dataset, target.vocab_size), vd))
    if cfg.draft.head_init == "target":
        draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
    draft.init_mask_embedding(target.embed_tokens.weight)
    draft.attach_target(target.embed_tokens, target.head)
    return draft


def cache_layers(cfg: PEagleRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold: the three taps, and `final` for the labels."""
    return taps_and_final(cfg.draft.feature_layers, lambda: default_feature_layers(target.num_layers))


def build_method(cfg: PEagleRecipe, target: FrozenTarget, data: DataBundle) -> PEagleMethod:
    target.check_layer_ids(cfg.draft.feature_layers or [])
    return PEagleMethod(target, build_draft(cfg, target, data.train), cfg.seed, objective=cfg.objective)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(PEagleRecipe, "draftsmith train peagle", __doc__ or "", build_method, cache_layers), argv
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
