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
import torch.nn.functional as F
from torch import nn

from draftsmith.models.chunking import (
    LOSS_CHUNK_TOKENS,
    chunk_positions,
    chunked_loss,
)
from draftsmith.models.copy_head import init_copy_head_from_data
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map, default_feature_layers, resolve_draft_vocab
from draftsmith.models.losses import eagle1_mask
from draftsmith.models.objectives import (
    ObjectiveConfig,
    chain_weights,
    per_column,
)
from draftsmith.models.parts import shift_left
from draftsmith.models.target import TOP1, FrozenTarget, LayerId
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.distributed import requested_engine
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import chain_tau_estimate, recorded, start_to_end
from draftsmith.train.core.recipe import (
    ObjectiveSection,
    Recipe,
    RecipeConfig,
    run_dir,
    seed_field,
    taps_and_final,
)
from draftsmith.train.eagle_chunks import (
    argmax_ce,
    data_labels,
    eagle1_chunk,
    eagle3_chunk,
    eagle3_data_chunk,
    top1_labels,
)
from draftsmith.train.eagle_vocab import label_token_counts
from draftsmith.train.prompt_lookup import COPY_TERM, copy_rows, copy_weights, with_copy_term

TAU_ESTIMATE_DEPTH = 5  # EAGLE-1 trains one step; its estimate assumes that accuracy at every depth


@dataclass
class EagleRecipe(RecipeConfig[EagleConfig], ObjectiveSection[EagleConfig]):
    """Everything an EAGLE run needs; YAML recipes under recipes/eagle/ mirror it."""

    output_dir: str = run_dir("runs/eagle")
    seed: int = seed_field("Seed for initialisation, noise, data split and order.")
    draft: EagleConfig = field(default_factory=EagleConfig)

    def __post_init__(self) -> None:
        if self.draft.hass_topk and self.objective.loss is not None:
            raise ValueError(
                f"draft.hass_topk adds HASS's term to EAGLE-3's own soft cross-entropy; objective.loss="
                f"{self.objective.loss} replaces that loss: set objective.loss=null, or draft.hass_topk=0"
            )
        if self.draft.labels != "target" and (
            self.objective.loss not in (None, "ce") or self.objective.weighting == "dpace"
        ):
            raise ValueError(
                f"draft.labels={self.draft.labels} trains on hard labels (cross-entropy), but objective.loss="
                f"{self.objective.loss} / objective.weighting={self.objective.weighting} needs the target's "
                "distribution: set draft.labels=target, or objective.loss=ce (or null) with a fixed or exp_decay "
                "weighting"
            )


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


class EagleMethod(TrainingMethod):
    """The loop's view of EAGLE: features from the frozen target, the drafter, its loss terms.

    `loss_chunk`: tokens whose logits (the draft's and the target's soft labels) are computed at once (see
    `chunked_loss`); the loss is the same for any value. `objective`: the per-position loss and depth weights
    (default: soft cross-entropy against the target, TTT step s weighted step_decay**s; EAGLE-1's weighting
    applies to its classification term). Every objective is measured against the target distribution of the
    soft label; `ce`'s label is the target's argmax; a D-PACE chain is the TTT steps at one column. With
    `draft.labels: data` (EAGLE-3) the label is the data's next token, with `top1` the target's greedy token
    (cached with the features), and the loss their cross-entropy.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft: Eagle1Draft | Eagle3Draft,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
        objective: ObjectiveConfig | None = None,
    ):
        self.target = target
        self.loss_chunk = loss_chunk
        self.model: nn.Module = draft
        self.version = draft.config.version
        self.objective = objective or ObjectiveConfig()
        if self.version == 1:
            self.term_names = ["depth1_reg", "depth1"]
            self.term_weights = torch.tensor([draft.config.reg_weight, draft.config.cls_weight])
            if self.objective.weighting != "fixed":
                cls = self.objective.term_weights(self.term_weights[1:], scale=draft.config.cls_weight)
                self.term_weights = torch.cat([self.term_weights[:1], cls])
        else:
            S = draft.config.ttt_steps
            self.term_names = [f"depth{s + 1}" for s in range(S)]  # TTT step s drafts depth s+1
            self.term_weights = self.objective.term_weights(
                torch.tensor([draft.config.step_decay**s for s in range(S)])
            )
            # one more term with draft.copy_attention: the copy head's attention (train/prompt_lookup.py)
            if draft.config.copy_attention:
                self.term_names.append(COPY_TERM)
                self.term_weights = torch.cat(
                    [self.term_weights, torch.tensor([draft.config.copy_attention])]
                )
        self.feature_layers: tuple[LayerId, ...] = tuple(draft.feature_layers)
        self.labels = "target" if self.version == 1 else draft.config.labels
        self.soft_labels = self.labels == "target"
        self.train_on = draft.config.train_on
        self.copy_attention = self.version == 3 and bool(draft.config.copy_attention)

    def prepare_batch(
        self, model: nn.Module, batch: dict[str, torch.Tensor], step: int, micro_batch: int, rank: int
    ) -> dict[str, torch.Tensor]:
        """`draft.train_on: all`: a training batch's loss mask becomes every real token, so the prompts' positions
        train too (with the target's own predictions as labels); held-out batches never pass here and keep the
        answers' mask."""
        if self.train_on == "answers":
            return batch
        return {**batch, "loss_mask": batch["attention_mask"].to(batch["loss_mask"].dtype)}

    def _masks(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each TTT step's loss mask (`step_masks`); with data labels, also where the label token exists (top1's
        label is the target's prediction at position t+s+1, which `step_masks` already requires)."""
        masks = step_masks(batch, 1 if self.version == 1 else draft_steps(self.term_names))
        if self.labels != "data":
            return masks
        return [m & (data_labels(batch, s) >= 0) for s, m in enumerate(masks)]

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        masks = self._masks(batch)
        counts = torch.stack([m.sum() for m in masks]).float()
        if self.version == 1:
            return counts.repeat(2)
        if self.copy_attention:
            counts = torch.cat([counts, copy_rows(batch, masks[0])[1].sum().float()[None]])
        return counts

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        soft = self.soft_labels
        # `final` gives the soft labels (EAGLE-1: also the regression targets); data labels need no target state,
        # top1 labels the target's greedy tokens (cached, or computed here with the features)
        extras: dict[str, list[LayerId]] = {"target": ["final"], "top1": [TOP1], "data": []}
        extra = extras[self.labels]
        wanted: list[LayerId] = [*self.feature_layers, *extra]
        layers = tuple(dict.fromkeys(wanted))
        feats, _ = self.target.batch_features(batch, layers)
        masks = self._masks(batch)
        chunk = chunk_positions(ids.shape[0], self.loss_chunk)
        head, objective = self.target.head, self.objective
        if self.version == 1:
            f = feats["final"]
            predicted = model(draft.input_noise(f), shift_left(ids))
            m = eagle1_mask(masks[0])
            inputs = (predicted, shift_left(f), m)
            weights = self._weights(draft, [predicted], [shift_left(f)], [m], chunk)[0]
            fn = eagle1_chunk(draft, head, objective)
            sums, _, metrics = chunked_loss(fn, (*inputs, weights), chunk, keep=m)
            return sums, metrics
        g = torch.cat([feats[i] for i in self.feature_layers], dim=-1)
        # one [B, T, H] per TTT step (the logits are computed per chunk), and the copy head's scores or None
        hidden, scores = model(g, ids)
        if not soft:
            sums, metrics = self._hard_label_terms(model, batch, feats, hidden, masks, chunk)
        else:
            sums, metrics = self._soft_label_terms(draft, batch, feats, hidden, masks, chunk)
        if scores is None:
            return sums, metrics
        return with_copy_term(scores, batch, masks[0], sums, metrics)

    def _soft_label_terms(
        self,
        draft: Any,
        batch: dict[str, torch.Tensor],
        feats: dict[LayerId, torch.Tensor],
        hidden: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor],
        chunk: int,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """EAGLE-3's loss terms against the target's distributions (`draft.labels: target`)."""
        ids, S = batch["input_ids"], len(hidden)
        # Step s's soft label at column t is the target's distribution at position t+s+1 (zeros past the end).
        # `windows[:, t, :, s]` is that state: a strided view of one zero-padded copy of `final`, so a chunk of
        # columns carries the c+S-1 states its S steps read and the target head runs once per chunk, not once
        # per step (the frozen head over the full vocabulary is about as many multiply-adds per token as the
        # drafter's whole step: 28M against about 25M for SmolLM2-135M with an 8,192-token draft vocabulary).
        final = F.pad(feats["final"], (0, 0, 0, S))
        windows = final[:, 1:].unfold(1, S, 1)  # [B, T, H, S]
        finals = [final[:, s + 1 : s + 1 + ids.shape[1]] for s in range(S)]
        weights = self._weights(draft, hidden, finals, masks, chunk)
        if draft.config.copy_weight:
            # copies of the data's next token: the soft label's argmax on the target's own answers
            data = torch.stack([data_labels(batch, s) for s in range(S)], -1)
            weights = weights * self._copy_weights(draft, batch, data).permute(2, 0, 1)
        fn = eagle3_chunk(draft, self.target.head, self.objective)
        inputs = (*hidden, windows, torch.stack(list(masks), -1), weights.permute(1, 2, 0))
        # A chunk computes all S steps' logits: c/S columns each keep one step's worth of vocabulary rows alive.
        sums, _, metrics = chunked_loss(fn, inputs, max(1, chunk // S))
        return sums, metrics

    def _hard_label_terms(
        self,
        model: nn.Module,
        batch: dict[str, torch.Tensor],
        feats: dict[LayerId, torch.Tensor],
        hidden: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor],
        chunk: int,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """EAGLE-3's loss terms with `draft.labels` top1 or data: each step's cross-entropy on its hard labels."""
        S = len(hidden)
        if self.labels == "top1":
            labels = torch.stack([top1_labels(feats[TOP1], s) for s in range(S)], -1)  # [B, T, S]
        else:
            labels = torch.stack([data_labels(batch, s) for s in range(S)], -1)
        stacked = torch.stack(list(masks), -1)
        weights = self._copy_weights(model, batch, labels)
        inputs = (*hidden, labels.clamp(min=0), stacked, stacked * weights)
        # only the columns some step trains reach the head (not the prompt's, not the padding)
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        fn = eagle3_data_chunk(draft)
        sums, _, metrics = chunked_loss(fn, inputs, max(1, chunk // S), keep=stacked.any(-1))
        return sums, metrics

    def _copy_weights(
        self, model: nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor
    ) -> torch.Tensor:
        """`[B, T, S]`: `draft.copy_weight`'s loss weights of the hard `labels` in training, ones on held-out
        batches (whose loss stays comparable between runs)."""
        draft: Any = model.module if hasattr(model, "module") else model
        if not (model.training and draft.config.copy_weight):
            return torch.ones(labels.shape, device=labels.device)
        return copy_weights(batch["input_ids"], batch["attention_mask"], labels, draft.config.copy_weight)

    def _weights(
        self,
        draft: Any,
        hidden: Sequence[torch.Tensor],
        finals: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor],
        chunk: int,
    ) -> torch.Tensor:
        """Per-position loss weights `[D, B, T]`: the masks, or D-PACE's weights of the chain of depths at each
        column, from the draft's cross-entropy on the target's argmax (in the draft vocabulary; a position
        whose argmax is outside it is an invalid slot)."""
        mask = torch.stack(list(masks))
        if self.objective.weighting != "dpace":
            return mask.float()
        fn = argmax_ce(draft, self.target.head)
        out = torch.stack([per_column(fn, (h, f), chunk) for h, f in zip(hidden, finals, strict=True)])
        return chain_weights(out[..., 0], mask & (out[..., 1] > 0), self.objective.dpace_alpha)

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate`: 1 + sum_d prod_{s<d} acc_s (EAGLE-1: its one accuracy at every depth up to 5)."""
        accs = recorded(
            record,
            [
                f"{prefix}/{name}/top1"
                for name in self.term_names
                if name != COPY_TERM and not name.endswith("_reg")
            ],
        )
        if accs is None:
            return {}
        if self.version == 1:
            accs = accs * TAU_ESTIMATE_DEPTH
        return {f"{prefix}/tau_estimate": chain_tau_estimate(accs)}

    def report(self, result: LoopResult) -> str:
        return format_step_table(result.eval, self.term_names, result.initial_eval)


class _Eagle3Train(Eagle3Draft):
    """EAGLE-3 whose forward is the TTT unroll up to the draft head, so accelerate / DDP wrap one call per
    step; the loss applies the head one sequence chunk at a time."""

    def forward(
        self, features: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Every TTT step's output, and with `draft.copy_attention` kv group 0's step-0 attention scores."""
        hidden = self.unroll_hidden(features, input_ids)
        if not self.config.copy_attention:
            return hidden, None
        return hidden, self.group_scores(self.project(features), shift_left(input_ids))


def build_draft(cfg: EagleRecipe, target: FrozenTarget, train_dataset: object) -> Eagle1Draft | Eagle3Draft:
    if cfg.draft.version == 1:
        draft: Eagle1Draft | Eagle3Draft = Eagle1Draft(cfg.draft, target.model.config, target.vocab_size)
    else:
        vd = resolve_draft_vocab(cfg.draft.draft_vocab_size, target.vocab_size)
        draft = _Eagle3Train(cfg.draft, target.model.config, vd)
        if draft.draft_vocab_size < target.vocab_size:
            draft.set_vocab_map(
                *build_vocab_map(label_token_counts(train_dataset, target.vocab_size, cfg.draft.labels), vd)
            )
        if cfg.draft.head_init == "target":
            draft.init_head_from_target(target.lm_head.weight, target.decoder.norm)
        if cfg.draft.layer_init == "target":
            draft.init_layer_from_target(target.decoder.layers[-1])
        if cfg.draft.layer_init == "copy":
            if cfg.draft.freeze_copy_head != "off" and requested_engine() is not None:
                raise ValueError(
                    f"draft.freeze_copy_head masks gradients of parameters that {requested_engine()} shards; "
                    "launch with recipes/accelerate/ddp.yaml (or one process), or drop the option"
                )
            init_copy_head_from_data(draft, target, train_dataset)
    draft.attach_target(target.embed_tokens, target.head)
    return draft


def cache_layers(cfg: EagleRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold for this recipe: the feature taps, and `final` for the soft labels (or the
    target's greedy tokens, `top1`, for its hard labels)."""
    if cfg.draft.version == 1:
        return ["final"]
    layers = taps_and_final(cfg.draft.feature_layers, lambda: default_feature_layers(target.num_layers))
    return {"target": layers, "data": layers[:-1], "top1": [*layers[:-1], TOP1]}[cfg.draft.labels]


def build_method(cfg: EagleRecipe, target: FrozenTarget, data: DataBundle) -> EagleMethod:
    target.check_layer_ids(cfg.draft.feature_layers or [])
    return EagleMethod(target, build_draft(cfg, target, data.train), objective=cfg.objective)


def offline_target_layers(cfg: EagleRecipe) -> int:
    """How many target layers a run from a feature cache loads: none, or with `draft.layer_init: target` all of
    them (the loader builds the first k layers, and the draft layer starts from the last one)."""
    return sys.maxsize if cfg.draft.version == 3 and cfg.draft.layer_init == "target" else 0


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(
            EagleRecipe,
            "draftsmith train eagle",
            __doc__ or "",
            build_method,
            cache_layers,
            offline_target_layers,
        ),
        argv,
    )


def draft_steps(term_names: list[str]) -> int:
    """How many of EAGLE-3's loss terms are draft steps (all but the copy-attention term)."""
    return sum(name != COPY_TERM for name in term_names)


def format_step_table(
    metrics: dict[str, float], term_names: list[str], start: dict[str, float] | None = None
) -> str:
    """Markdown table of held-out teacher-forced top-1 per depth (TTT step), and the tau estimate (start -> end)."""
    start = start or {}
    rows = []
    for s, name in enumerate(n for n in term_names if n != COPY_TERM and not n.endswith("_reg")):
        cells = [start_to_end(f"eval/{name}/{key}", metrics, start) for key in ("top1", "loss")]
        rows.append([s + 1, f"x(t+{s + 2})", *cells])
    lines = table(["depth", "predicts", "top-1", "loss"], rows)
    if "eval/tau_estimate" in metrics:
        lines.append(
            f"\ntau estimate (1 + sum of products of step accuracies): "
            f"{start_to_end('eval/tau_estimate', metrics, start)}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_main(main))
