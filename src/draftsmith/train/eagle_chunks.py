"""The EAGLE losses of one sequence chunk, for `chunked_loss` (ALGORITHMS.md sections 3 and 5): EAGLE-1's
regression and soft cross-entropy, EAGLE-3's TTT steps against the target's distribution or the data's next
tokens, and D-PACE's argmax cross-entropy. Each returns `(sums [K], counts [K], {"top1": [K], "alpha": [K]})`
and skips its metrics while `recomputing()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from draftsmith.models.chunking import ChunkResult, recomputing, token_cross_entropy
from draftsmith.models.eagle import Eagle1Draft
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.models.losses import (
    eagle1_chunk_loss,
    eagle1_regression,
    eagle3_step_loss,
)
from draftsmith.models.objectives import ObjectiveConfig, acceptance_sum, masked_objective


def target_view(draft: Any, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        target, kept = target_view(draft, head(final))
        ce = token_cross_entropy(draft.logits(hidden), target.argmax(-1))
        return torch.stack([ce, kept.float()], dim=-1)

    return fn


def eagle1_chunk(
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
        top1 = hits(logits, labels.argmax(-1), mask)
        n = mask.sum().float().reshape(1)
        return torch.cat([reg, cls]), n.repeat(2), {"top1": top1.repeat(2), "alpha": alpha.repeat(2)}

    return fn


def hits(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Correct top-1 predictions `[1]` on `mask` (0 while `recomputing()`)."""
    if recomputing():
        return logits.new_zeros(1, dtype=torch.float32)
    with torch.no_grad():
        return ((logits.argmax(-1) == labels) & mask).sum().float().reshape(1)


def eagle3_chunk(
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
        out, reached = [], None
        for s, h in enumerate(hidden):
            logits, target = draft.logits(h), target_logits[:, s : s + c]
            out.append(eagle3_step(draft, objective, logits, target, masks[..., s], weights[..., s], reached))
            if k := draft.config.reach_topk:
                with torch.no_grad():
                    view, kept = target_view(draft, target)
                    now = kept & within_topk(logits, view.argmax(-1), k)
                reached = now if reached is None else reached & now
        sums, counts = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        return sums, counts, {name: torch.cat([o[2][name] for o in out]) for name in ("top1", "alpha")}

    return fn


def eagle3_step(
    draft: Eagle3Draft,
    objective: ObjectiveConfig,
    logits: torch.Tensor,
    target_logits: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    reached: torch.Tensor | None = None,
) -> ChunkResult:
    """One TTT step's `(sum [1], count [1], {"top1": [1], "alpha": [1]})` from the draft's logits `[B, c, Vd]` and
    the target's `[B, c, V]` at the positions the step predicts. `reached` `[B, c]` (`draft.reach_topk`): the
    columns whose earlier steps' labels were in the draft's top-k; the others leave the loss, not the count or
    the metrics (which stay teacher-forced, as the tau estimate reads them)."""
    if reached is not None:
        weights = weights * reached
    if objective.loss is None:
        plain = objective.weighting == "fixed" and reached is None and not draft.config.copy_weight
        w = None if plain else weights
        cfg = draft.config
        loss, count, hit, alpha = eagle3_step_loss(
            logits, target_logits, mask, draft.t2d, w, cfg.hass_topk, cfg.hass_weight
        )
        return loss.reshape(1), count.reshape(1), {"top1": hit.reshape(1), "alpha": alpha.reshape(1)}
    with torch.no_grad():
        target, kept = target_view(draft, target_logits)
    labels = target.argmax(-1)
    loss, alpha = masked_objective(
        objective.loss, logits, target, labels, weights * kept, mask & kept, kappa=objective.lk_kappa
    )
    return loss, mask.sum().float().reshape(1), {"top1": hits(logits, labels, mask & kept), "alpha": alpha}


def within_topk(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """`[B, c]` bool: whether each label (a draft-vocabulary id) is among the `k` largest of its logits."""
    return (logits.topk(min(k, logits.shape[-1]), dim=-1).indices == labels[..., None]).any(-1)


def data_labels(batch: dict[str, torch.Tensor], step: int) -> torch.Tensor:
    """TTT step `step`'s hard labels `[B, T]`: at column t the data's token x_{t+step+2}, the token whose target
    distribution (at position t+step+1) is the soft label; -1 where that position is padding or past the end."""
    ids, real = batch["input_ids"], batch["attention_mask"].bool()
    k = step + 2
    out = torch.full_like(ids, -1)
    if ids.shape[1] > k:
        out[:, :-k] = torch.where(real[:, k:], ids[:, k:], -1)
    return out


def top1_labels(top1: torch.Tensor, step: int) -> torch.Tensor:
    """TTT step `step`'s hard labels `[B, T]` with `draft.labels: top1`: at column t the target's greedy token at
    position t+step+1 (its prediction of x_{t+step+2}, the argmax of the soft label), 0 past the end (masked)."""
    k = step + 1
    out = torch.zeros_like(top1)
    if top1.shape[1] > k:
        out[:, :-k] = top1[:, k:]
    return out


def eagle3_data_chunk(draft: Eagle3Draft) -> Callable[..., ChunkResult]:
    """Every TTT step's cross-entropy on the data's next tokens (`draft.labels: data`) on one chunk of c columns:
    `(draft output of step s [B, c, H] for each of the S steps, labels [B, c, S] target ids, masks [B, c, S],
    loss weights [B, c, S] (zero off the mask; `draft.copy_weight`'s, else the mask))` -> `(sums [S],
    counts [S], {"top1": [S], "alpha": [S]})`. As with soft labels, a label outside the draft vocabulary is
    dropped from the loss but stays in the count; alpha is the draft's probability of the label (sum_v min(p, q)
    for a one-hot p)."""
    # Target id -> draft id: the draft vocabulary is the target ids where t2d is set, in increasing order.
    t2d = draft.t2d
    to_draft = torch.cumsum(t2d.long(), 0) - 1

    def fn(*parts: torch.Tensor) -> ChunkResult:
        *hidden, labels, masks, weights = parts
        sums, counts, hits, alphas = [], [], [], []
        reached = None  # every column trains until draft.reach_topk leaves some unreached
        for s, h in enumerate(hidden):
            label, mask = labels[..., s], masks[..., s]
            kept = (mask & t2d[label]).float()
            target = to_draft[label].clamp(min=0)
            logits = draft.logits(h).float()
            ce = token_cross_entropy(logits, target)
            trained = kept * weights[..., s] if reached is None else kept * weights[..., s] * reached
            sums.append((ce * trained).sum().reshape(1))
            counts.append(mask.sum().float().reshape(1))
            # GRIFFIN (draft.reach_topk): later steps train only where these labels were in the top-k
            if k := draft.config.reach_topk:
                with torch.no_grad():
                    now = t2d[label] & within_topk(logits, target, k)
                    reached = now if reached is None else reached & now
            if recomputing():
                hits.append(logits.new_zeros(1))
                alphas.append(logits.new_zeros(1))
                continue
            with torch.no_grad():
                hits.append(((logits.argmax(-1) == target).float() * kept).sum().reshape(1))
                alphas.append(((-ce).exp() * kept).sum().reshape(1))
        return torch.cat(sums), torch.cat(counts), {"top1": torch.cat(hits), "alpha": torch.cat(alphas)}

    return fn
