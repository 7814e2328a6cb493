"""Train EAGLE-1 or EAGLE-3 heads on a frozen target, online (ALGORITHMS.md sections 3 and 5).

    accelerate launch train/eagle.py --config recipes/eagle/eagle3_toy.yaml target.path=DIR output_dir=OUT
    draftsmith train eagle --config recipes/eagle/eagle1_toy.yaml target.path=DIR output_dir=OUT [--resume]

`draft.version: 1|3` picks the drafter. Logged per step s (EAGLE-1: the one teacher-forced step) on training
and held-out data: loss, teacher-forced top-1 agreement with the target, and `tau_estimate` = 1 + sum over
depths d of prod_{s<d} acc_s, an ESTIMATE of the acceptance length (the evaluator measures the real one).
"""

from __future__ import annotations

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
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map, default_feature_layers
from draftsmith.models.losses import eagle1_chunk_loss, eagle1_mask, eagle1_regression, eagle3_step_loss
from draftsmith.models.objectives import (
    ObjectiveConfig,
    acceptance_sum,
    chain_weights,
    masked_objective,
    per_column,
)
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.loop import LoopResult
from draftsmith.train.core.method import TrainingMethod
from draftsmith.train.core.metrics import chain_tau_estimate, recorded
from draftsmith.train.core.recipe import (
    ObjectiveSection,
    Recipe,
    RecipeConfig,
    run_dir,
    seed_field,
    taps_and_final,
)

TAU_ESTIMATE_DEPTH = 5  # EAGLE-1 trains one step; its estimate assumes that accuracy at every depth


@dataclass
class EagleRecipe(RecipeConfig[EagleConfig], ObjectiveSection[EagleConfig]):
    """Everything an EAGLE run needs; YAML recipes under recipes/eagle/ mirror it."""

    output_dir: str = run_dir("runs/eagle")
    seed: int = seed_field("Seed for initialisation, noise, data split and order.")
    draft: EagleConfig = field(default_factory=EagleConfig)


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
    soft label; `ce`'s label is the target's argmax; a D-PACE chain is the TTT steps at one column.
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
        self.feature_layers: tuple[LayerId, ...] = tuple(draft.feature_layers)

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        masks = step_masks(batch, 1 if self.version == 1 else len(self.term_names))
        counts = torch.stack([m.sum() for m in masks]).float()
        return counts.repeat(2) if self.version == 1 else counts

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        layers = tuple(dict.fromkeys((*self.feature_layers, "final")))  # the soft labels come from `final`
        feats, _ = self.target.batch_features(batch, layers)
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        masks = step_masks(batch, 1 if self.version == 1 else len(self.term_names))
        chunk = chunk_positions(ids.shape[0], self.loss_chunk)
        head, objective = self.target.head, self.objective
        if self.version == 1:
            f = feats["final"]
            predicted = model(draft.input_noise(f), shift_left(ids))
            m = eagle1_mask(masks[0])
            inputs = (predicted, shift_left(f), m)
            weights = self._weights(draft, [predicted], [shift_left(f)], [m], chunk)[0]
            sums, _, metrics = chunked_loss(_eagle1_chunk(draft, head, objective), (*inputs, weights), chunk)
            return sums, metrics
        g = torch.cat([feats[i] for i in self.feature_layers], dim=-1)
        hidden = model(g, ids)  # one [B, T, H] per TTT step; the logits are computed per chunk
        S = len(hidden)
        # Step s's soft label at column t is the target's distribution at position t+s+1 (zeros past the end).
        # `windows[:, t, :, s]` is that state: a strided view of one zero-padded copy of `final`, so a chunk of
        # columns carries the c+S-1 states its S steps read and the target head runs once per chunk, not once
        # per step (the frozen head over the full vocabulary is about as many multiply-adds per token as the
        # drafter's whole step: 28M against about 25M for SmolLM2-135M with an 8,192-token draft vocabulary).
        final = F.pad(feats["final"], (0, 0, 0, S))
        windows = final[:, 1:].unfold(1, S, 1)  # [B, T, H, S]
        finals = [final[:, s + 1 : s + 1 + ids.shape[1]] for s in range(S)]
        weights = self._weights(draft, hidden, finals, masks, chunk)
        fn = _eagle3_chunk(draft, head, objective)
        inputs = (*hidden, windows, torch.stack(masks, -1), weights.permute(1, 2, 0))
        # A chunk computes all S steps' logits: c/S columns each keep one step's worth of vocabulary rows alive.
        sums, _, metrics = chunked_loss(fn, inputs, max(1, chunk // S))
        return sums, metrics

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
            record, [f"{prefix}/{name}/top1" for name in self.term_names if not name.endswith("_reg")]
        )
        if accs is None:
            return {}
        if self.version == 1:
            accs = accs * TAU_ESTIMATE_DEPTH
        return {f"{prefix}/tau_estimate": chain_tau_estimate(accs)}

    def report(self, result: LoopResult) -> str:
        return format_step_table(result.eval, self.term_names, result.initial_eval)


def _target_view(draft: Any, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(the target's logits over the draft vocabulary [B, c, Vd], kept [B, c] bool)`: kept where the target's
    argmax is inside the draft vocabulary (always for EAGLE-1 and a full vocabulary)."""
    vd = getattr(draft, "draft_vocab_size", target_logits.shape[-1])
    if vd == target_logits.shape[-1]:
        return target_logits, torch.ones(
            target_logits.shape[:-1], dtype=torch.bool, device=target_logits.device
        )
    return target_logits[..., draft.t2d], draft.t2d[target_logits.argmax(-1)]


def argmax_ce(draft: Any, head: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`(draft state [B, c, H], target state [B, c, H])` -> `[B, c, 2]`: the draft's cross-entropy on the target's
    argmax and whether that argmax is in the draft vocabulary (D-PACE's confidence; no gradient)."""

    def fn(hidden: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        target, kept = _target_view(draft, head(final))
        ce = F.cross_entropy(
            draft.logits(hidden).float().transpose(1, 2), target.argmax(-1), reduction="none"
        )
        return torch.stack([ce, kept.float()], dim=-1)

    return fn


def _eagle1_chunk(
    draft: Eagle1Draft, head: Callable[[torch.Tensor], torch.Tensor], objective: ObjectiveConfig
) -> Callable[..., ChunkResult]:
    """EAGLE-1's loss on one chunk: `(predicted [B, c, H], next features [B, c, H], mask [B, c], weights [B, c])`
    -> sums, with the drafter's logits through the frozen head and the soft labels `head(f_{t+1})` computed
    here."""

    def fn(
        predicted: torch.Tensor, next_features: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
    ) -> ChunkResult:
        with torch.no_grad():
            labels = head(next_features)
        logits = draft.logits(predicted)
        if objective.loss is None:
            w = None if objective.weighting == "fixed" else weights
            sums, counts, metrics = eagle1_chunk_loss(predicted, next_features, logits, labels, mask, w)
            alpha = acceptance_sum(logits, None if recomputing() else labels, mask)
            return sums, counts, {**metrics, "alpha": alpha.repeat(2)}
        cls, alpha = masked_objective(
            objective.loss, logits, labels, labels.argmax(-1), weights, mask, kappa=objective.lk_kappa
        )
        reg = (eagle1_regression(predicted, next_features) * mask).sum().reshape(1)
        top1 = _hits(logits, labels.argmax(-1), mask)
        n = mask.sum().float().reshape(1)
        return torch.cat([reg, cls]), n.repeat(2), {"top1": top1.repeat(2), "alpha": alpha.repeat(2)}

    return fn


def _hits(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Correct top-1 predictions `[1]` on `mask` (0 while `recomputing()`)."""
    if recomputing():
        return logits.new_zeros(1, dtype=torch.float32)
    with torch.no_grad():
        return ((logits.argmax(-1) == labels) & mask).sum().float().reshape(1)


def _eagle3_chunk(
    draft: Eagle3Draft, head: Callable[[torch.Tensor], torch.Tensor], objective: ObjectiveConfig
) -> Callable[..., ChunkResult]:
    """Every TTT step's loss on one chunk of c columns: `(draft output of step s [B, c, H] for each of the S
    steps, the target's final states read by the steps [B, c, H, S] (see `loss_terms`), masks [B, c, S],
    weights [B, c, S])` -> `(sums [S], counts [S], {"top1": [S], "alpha": [S]})`."""

    def fn(*parts: torch.Tensor) -> ChunkResult:
        *hidden, windows, masks, weights = parts
        c = windows.shape[1]
        with torch.no_grad():  # the c+S-1 distinct states, then the target's logits over them, once
            states = torch.cat([windows[..., 0], windows[:, -1, :, 1:].transpose(1, 2)], dim=1)
            target_logits = head(states)
        out = [
            _eagle3_step(
                draft, objective, draft.logits(h), target_logits[:, s : s + c], masks[..., s], weights[..., s]
            )
            for s, h in enumerate(hidden)
        ]
        sums, counts = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        return sums, counts, {name: torch.cat([o[2][name] for o in out]) for name in ("top1", "alpha")}

    return fn


def _eagle3_step(
    draft: Eagle3Draft,
    objective: ObjectiveConfig,
    logits: torch.Tensor,
    target_logits: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
) -> ChunkResult:
    """One TTT step's `(sum [1], count [1], {"top1": [1], "alpha": [1]})` from the draft's logits `[B, c, Vd]` and
    the target's `[B, c, V]` at the positions the step predicts."""
    if objective.loss is None:
        w = None if objective.weighting == "fixed" else weights
        loss, count, hit, alpha = eagle3_step_loss(logits, target_logits, mask, draft.t2d, w)
        return loss.reshape(1), count.reshape(1), {"top1": hit.reshape(1), "alpha": alpha.reshape(1)}
    with torch.no_grad():
        target, kept = _target_view(draft, target_logits)
    labels = target.argmax(-1)
    loss, alpha = masked_objective(
        objective.loss, logits, target, labels, weights * kept, mask & kept, kappa=objective.lk_kappa
    )
    return loss, mask.sum().float().reshape(1), {"top1": _hits(logits, labels, mask & kept), "alpha": alpha}


class _Eagle3Train(Eagle3Draft):
    """EAGLE-3 whose forward is the TTT unroll up to the draft head, so accelerate / DDP wrap one call per
    step; the loss applies the head one sequence chunk at a time."""

    def forward(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        return self.unroll_hidden(features, input_ids)


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
    draft.attach_target(target.embed_tokens, target.head)
    return draft


def cache_layers(cfg: EagleRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold for this recipe: the feature taps, and `final` for the logits."""
    if cfg.draft.version == 1:
        return ["final"]
    return taps_and_final(cfg.draft.feature_layers, lambda: default_feature_layers(target.num_layers))


def build_method(cfg: EagleRecipe, target: FrozenTarget, data: DataBundle) -> EagleMethod:
    target.check_layer_ids(cfg.draft.feature_layers or [])
    return EagleMethod(target, build_draft(cfg, target, data.train), objective=cfg.objective)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(EagleRecipe, "draftsmith train eagle", __doc__ or "", build_method, cache_layers), argv
    )


def format_step_table(
    metrics: dict[str, float], term_names: list[str], start: dict[str, float] | None = None
) -> str:
    """Markdown table of held-out teacher-forced top-1 per depth (TTT step), and the tau estimate (start -> end)."""
    start = start or {}
    rows = ["| depth | predicts | top-1 | loss |", "|---|---|---|---|"]
    for s, name in enumerate(n for n in term_names if not n.endswith("_reg")):
        cells = []
        for key in ("top1", "loss"):
            k = f"eval/{name}/{key}"
            if k not in metrics:
                cells.append("-")  # no held-out evaluation ran (eval.every = 0)
            else:
                cells.append(f"{start[k]:.3f} -> {metrics[k]:.3f}" if k in start else f"{metrics[k]:.3f}")
        rows.append(f"| {s + 1} | x(t+{s + 2}) | " + " | ".join(cells) + " |")
    if "eval/tau_estimate" in metrics:
        begin = f"{start['eval/tau_estimate']:.3f} -> " if "eval/tau_estimate" in start else ""
        rows.append(
            f"\ntau estimate (1 + sum of products of step accuracies): {begin}{metrics['eval/tau_estimate']:.3f}"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(run_main(main))
