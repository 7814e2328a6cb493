"""Train DeepSeek-V3-style MTP modules on a frozen target (ALGORITHMS.md section 7.1).

    accelerate launch train/mtp.py --config recipes/mtp/toy.yaml target.path=DIR output_dir=OUT
    draftsmith train mtp --config recipes/mtp/toy.yaml target.path=DIR output_dir=OUT [--resume]

Module k (k = 1..draft.num_modules) at column i predicts t_{i+k+1}; the loss is (lambda / D) * sum_k of its
cross-entropy on the data's tokens, over the columns whose predicted token is an answer token. Logged per
depth: loss, `top1` (agreement with the data token), `agree` (agreement with the target's own greedy choice
at that position, what greedy speculative decoding accepts), and `tau_estimate` = 1 + sum over depths of
the product of `agree` (an ESTIMATE for a chain of D; the evaluator measures the real one).
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
    chunked_argmax,
    chunked_loss,
    recomputing,
    token_cross_entropy,
)
from draftsmith.models.losses import mtp_depth_loss, mtp_hits
from draftsmith.models.mtp import MTPConfig, MTPDraft, shift_tokens
from draftsmith.models.objectives import (
    ObjectiveConfig,
    acceptance_sum,
    chain_weights,
    masked_objective,
    per_column,
)
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import run_main
from draftsmith.train.core.data import DataBundle
from draftsmith.train.core.entry import train_main
from draftsmith.train.core.method import LoopResult, TrainingMethod
from draftsmith.train.core.metrics import chain_tau_estimate, recorded, start_to_end
from draftsmith.train.core.recipe import ObjectiveSection, Recipe, RecipeConfig, run_dir


@dataclass
class MTPRecipe(RecipeConfig[MTPConfig], ObjectiveSection[MTPConfig]):
    """Everything an MTP run needs; YAML recipes under recipes/mtp/ mirror it."""

    output_dir: str = run_dir("runs/mtp")
    draft: MTPConfig = field(default_factory=MTPConfig)


RECIPE = MTPRecipe


def depth_masks(batch: dict[str, torch.Tensor], depths: int) -> list[torch.Tensor]:
    """Depth k's trained columns: i such that t_{i+k+1}, the token module k predicts there, is an answer
    token (which also makes every input token up to it real)."""
    return [shift_tokens(batch["loss_mask"].long(), k + 1).bool() for k in range(1, depths + 1)]


class MTPMethod(TrainingMethod):
    """The loop's view of MTP: the target's last residual stream in, D cross-entropy terms out.

    `loss_chunk`: tokens whose logits are computed at once (see `chunked_loss`); the loss is the same for
    any value. `objective`: the per-position loss and depth weights (default: cross-entropy on the data's
    tokens, every depth weighted loss_weight / D). Module k at column i predicts t_{i+k+1}: its target
    distribution is the target's at column i+k, its D-PACE chain the D modules at column i.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft: MTPDraft,
        loss_chunk: int = LOSS_CHUNK_TOKENS,
        objective: ObjectiveConfig | None = None,
    ):
        self.target = target
        self.loss_chunk = loss_chunk
        self.model: nn.Module = draft
        D = draft.config.num_modules
        self.term_names = [f"depth{k}" for k in range(1, D + 1)]
        self.objective = objective or ObjectiveConfig()
        fixed = torch.full((D,), draft.config.loss_weight / D)
        self.term_weights = self.objective.term_weights(fixed, scale=draft.config.loss_weight)
        self.feature_layers = draft.feature_layers

    def token_counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([m.sum() for m in depth_masks(batch, len(self.term_names))]).float()

    def loss_terms(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = batch["input_ids"]
        feats, _ = self.target.batch_features(batch, (*self.feature_layers, "final"))
        chunk = chunk_positions(ids.shape[0], self.loss_chunk)
        greedy = chunked_argmax(self.target.head, feats["final"], chunk)  # column j: the target's t_{j+1}
        draft: Any = model.module if hasattr(model, "module") else model  # unwrap DDP
        outputs = model(feats[self.feature_layers[0]], ids, project=False)  # h^k [B, T, H] per depth
        masks = depth_masks(batch, len(self.term_names))
        T, D = ids.shape[1], len(self.term_names)
        final = F.pad(feats["final"], (0, 0, 0, D))  # module k at column i: the target's final_{i+k}
        labels = [shift_tokens(ids, k + 1) for k in range(1, D + 1)]
        weights = torch.stack(masks).float()
        if self.objective.weighting == "dpace":
            ce = torch.stack(
                [per_column(_depth_ce(draft, k), (h, labels[k - 1]), chunk) for k, h in enumerate(outputs, 1)]
            )
            weights = chain_weights(ce, torch.stack(masks), self.objective.dpace_alpha)
        depths = [
            chunked_loss(
                _depth_chunk(draft, k, self.target.head, self.objective),
                (h, labels[k - 1], m, shift_tokens(greedy, k), final[:, k : k + T], weights[k - 1]),
                chunk,
                keep=m,  # the vocabulary-sized products only where the module trains
            )
            for k, (h, m) in enumerate(zip(outputs, masks, strict=True), start=1)
        ]
        sums = torch.cat([d[0] for d in depths])
        return sums, {name: torch.cat([d[2][name] for d in depths]) for name in ("top1", "agree", "alpha")}

    def derived_metrics(self, record: dict[str, float], prefix: str) -> dict[str, float]:
        """`tau_estimate` = 1 + sum_d prod_{k<=d} agree_k (a chain of D, i.i.d. across steps)."""
        accs = recorded(record, [f"{prefix}/{name}/agree" for name in self.term_names])
        if accs is None:
            return {}
        return {f"{prefix}/tau_estimate": chain_tau_estimate(accs)}

    def report(self, result: LoopResult) -> str:
        return format_depth_table(result.eval, len(self.term_names), result.initial_eval)


def _depth_ce(draft: MTPDraft, k: int) -> Callable[..., torch.Tensor]:
    """Module k's cross-entropy per column `[B, c]` on the data's tokens (D-PACE's confidence; no gradient)."""

    def fn(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(draft.logits(k, hidden), labels)

    return fn


def _depth_chunk(
    draft: MTPDraft, k: int, head: Callable[[torch.Tensor], torch.Tensor], objective: ObjectiveConfig
) -> Callable[..., ChunkResult]:
    """Module k's loss on one chunk: `(h^k [B, c, H], labels [B, c], mask [B, c], target greedy [B, c], the
    target's final state at column i+k [B, c, H], weights [B, c])` -> sums, metrics top1, agree, alpha."""

    def fn(
        hidden: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        greedy: torch.Tensor,
        final: torch.Tensor,
        weights: torch.Tensor,
    ) -> ChunkResult:
        logits = draft.logits(k, hidden)
        target_logits = None
        if objective.loss is not None or not recomputing():
            with torch.no_grad():
                target_logits = head(final)
        if objective.loss is None:
            w = None if objective.weighting == "fixed" else weights
            loss, count, metrics = mtp_depth_loss(logits, labels, mask, greedy, w)
            return loss, count, {**metrics, "alpha": acceptance_sum(logits, target_logits, mask)}
        loss, alpha = masked_objective(
            objective.loss, logits, target_logits, labels, weights, mask, kappa=objective.lk_kappa
        )
        top1, agree = mtp_hits(logits, labels, mask, greedy)
        return loss, mask.sum().float().reshape(1), {"top1": top1, "agree": agree, "alpha": alpha}

    return fn


def cache_layers(cfg: MTPRecipe, target: FrozenTarget) -> list[LayerId]:
    """What an offline cache must hold: the last residual stream (pre-norm) and `final` for the logits."""
    return [target.num_layers, "final"]


def build_method(cfg: MTPRecipe, target: FrozenTarget, data: DataBundle) -> MTPMethod:
    draft = MTPDraft(cfg.draft, target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    return MTPMethod(target, draft, objective=cfg.objective)


def format_depth_table(metrics: dict[str, float], depths: int, start: dict[str, float] | None = None) -> str:
    """Markdown table of held-out per-depth accuracy (start -> end)."""
    start = start or {}
    rows = []
    for k in range(1, depths + 1):
        keys = [f"eval/depth{k}/{key}" for key in ("top1", "agree", "loss")]
        cells = [start_to_end(key, metrics, start) for key in keys if key in metrics]
        rows.append([k, f"t+{k + 1}", *(cells or [""])])  # without held-out metrics: one empty cell
    lines = table(["module", "predicts", "top-1 (data)", "agrees with target", "loss"], rows)
    if "eval/tau_estimate" in metrics:
        lines.append(f"\ntau estimate (chain of {depths}): {metrics['eval/tau_estimate']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return train_main(
        Recipe(MTPRecipe, "draftsmith train mtp", __doc__ or "", build_method, cache_layers), argv
    )


if __name__ == "__main__":
    sys.exit(run_main(main))
