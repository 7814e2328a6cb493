"""Drafter losses: pure functions returning per-term sums and token counts, computed in fp32.

They know nothing of ranks or gradient accumulation: the training loop divides each term's sum by the
term's token count over the whole accumulation window on all ranks, then applies the term weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .chunking import ChunkResult, recomputing, token_cross_entropy


def shift_columns(x: torch.Tensor, k: int) -> torch.Tensor:
    """`x[:, t] <- x[:, t + k]` `[B, T, ...]`, zeros in the last k columns (all of them when k >= T)."""
    if k == 0:
        return x
    return torch.cat([x[:, k:], torch.zeros_like(x[:, :k])], dim=1)


def medusa_token_counts(loss_mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Loss tokens per head, known before the forward pass.

    Head k (1-based) at column t predicts x_{t+k+1}, so its targets are columns k+1..T-1 and a position
    counts when its *target* token is trained (an assistant token).

    Args:
        loss_mask: `[B, T]` bool, True on trained tokens.
        num_heads: K.

    Returns:
        `[K]` float32 counts.
    """
    T = loss_mask.shape[1]
    return torch.stack(
        [
            loss_mask[:, k + 1 :].sum() if k + 1 < T else loss_mask.new_zeros(()).sum()
            for k in range(1, num_heads + 1)
        ]
    ).float()


def medusa_head_loss(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None
) -> ChunkResult:
    """One Medusa head's cross-entropy on columns aligned with their labels, as sums.

    Args:
        logits: `[B, c, V]` the head's logits.
        labels: `[B, c]` the token each column predicts (any id where `mask` is False).
        mask: `[B, c]` bool, True where the label is a trained token.
        weights: `[B, c]` float per-column loss weights (e.g. D-PACE's); None = the mask.

    Returns:
        `(loss sum [1], count [1], {"top1": [1], "top5": [1]})`, top-k counting correct predictions on the same
        columns (left at 0 while `recomputing()`).
    """
    lg = logits.float()
    ce = token_cross_entropy(lg, labels)  # [B, c]
    top1, top5 = medusa_hits(lg, labels, mask)
    loss = (ce * (mask if weights is None else weights)).sum().reshape(1)
    return loss, mask.sum().float().reshape(1), {"top1": top1, "top5": top5}


def medusa_hits(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct top-1 / top-5 predictions `([1], [1])` of `[B, c, V]` logits on `mask` (0 while `recomputing()`)."""
    zero = logits.new_zeros(1, dtype=torch.float32)
    if recomputing():
        return zero, zero
    with torch.no_grad():
        hit = logits.topk(min(5, logits.shape[-1]), dim=-1).indices == labels.unsqueeze(-1)  # [B, c, 5]
        return (hit[..., 0] & mask).sum().float().reshape(1), (hit.any(-1) & mask).sum().float().reshape(1)


def medusa_targets(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and masks of every head, aligned with the columns that predict them.

    Head k (1-based) at column t predicts x_{t+k+1}: `labels[k-1, :, t] = x_{t+k+1}` and the mask is that
    token's `loss_mask` (False in the last k+1 columns, which have no such token).

    Returns:
        `(labels [K, B, T] long, masks [K, B, T] bool)`.
    """
    shifts = range(2, num_heads + 2)
    labels = torch.stack([shift_columns(input_ids, s) for s in shifts])
    masks = torch.stack([shift_columns(loss_mask.bool(), s) for s in shifts])
    return labels, masks


def medusa_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Medusa-1 cross-entropy per head (ALGORITHMS.md 2.2), as sums, from all heads' logits at once.

    Args:
        logits: `[K, B, T, V]`; head k (1-based, index k-1) at column t predicts x_{t+k+1}.
        input_ids: `[B, T]` the token ids (targets are the ids themselves, shifted by k+1).
        loss_mask: `[B, T]` bool, True on trained (assistant) tokens; indexes the target token.

    Returns:
        `(loss_sums [K], n_tokens [K], metrics)` where metrics holds `top1` and `top5` `[K]`: sums of
        correct predictions over the same positions (divide by `n_tokens` for accuracies). A head with no
        column to predict (k+1 >= T) has sum and count 0 and stays in the graph (DDP needs every head).
    """
    labels, masks = medusa_targets(input_ids, loss_mask, logits.shape[0])
    heads = [medusa_head_loss(logits[i], labels[i], masks[i]) for i in range(logits.shape[0])]
    return (
        torch.cat([h[0] for h in heads]),
        torch.cat([h[1] for h in heads]),
        {name: torch.cat([h[2][name] for h in heads]) for name in ("top1", "top5")},
    )


def soft_cross_entropy(target_probs: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """`-sum_v p(v) log q(v)` per position: the draft learns the target's distribution p (the target is the
    FIRST argument; this is KL(p || q) up to p's entropy, i.e. forward KL, mode-covering)."""
    return -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)


def eagle1_loss(
    predicted: torch.Tensor,
    features: torch.Tensor,
    predicted_logits: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """EAGLE-1 losses (ALGORITHMS.md 3.3), as sums over the masked columns.

    Args:
        predicted: `[B, T, H]` f_hat; column t predicts f_{t+1}.
        features: `[B, T, H]` the target's post-norm features f (the regression targets, shifted here).
        predicted_logits: `[B, T, V]` lm_head(f_hat).
        target_logits: `[B, T, V]` lm_head(f): column t+1 gives p(x_{t+2}), the soft label of column t.
        loss_mask: `[B, T]` bool; column t uses the mask of token x_t and the last column is dropped,
            reproducing the reference code (the first answer token is never a target, the two template
            tokens after an answer are).

    Returns:
        `(sums [2] = (SmoothL1 averaged over H, soft CE), count [2], {"top1": [2]})` where top1 counts
        argmax(q) == argmax(p) (the same value in both slots, so each term reports it).
    """
    return eagle1_chunk_loss(
        predicted,
        shift_columns(features, 1),
        predicted_logits,
        shift_columns(target_logits, 1),
        eagle1_mask(loss_mask),
    )


def eagle1_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """EAGLE-1's trained columns `[B, T]` bool: the loss mask with its last column dropped (see `eagle1_loss`)."""
    m = loss_mask.bool().clone()
    m[:, -1] = False
    return m


def eagle1_chunk_loss(
    predicted: torch.Tensor,
    next_features: torch.Tensor,
    predicted_logits: torch.Tensor,
    next_target_logits: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> ChunkResult:
    """`eagle1_loss` on columns already aligned with their targets (what `chunked_loss` slices).

    Args:
        predicted: `[B, c, H]` f_hat.
        next_features: `[B, c, H]` f_{t+1}, the regression target of column t.
        predicted_logits: `[B, c, V]` lm_head(f_hat).
        next_target_logits: `[B, c, V]` lm_head(f_{t+1}): the soft label of column t.
        mask: `[B, c]` bool, the trained columns (`eagle1_mask`).
        weights: `[B, c]` float weights of the soft cross-entropy (e.g. D-PACE's); None = mask.

    Returns:
        As `eagle1_loss` (top1 left at 0 while `recomputing()`).
    """
    m = mask.float()
    reg = eagle1_regression(predicted, next_features)
    p = torch.softmax(next_target_logits.float(), dim=-1)
    cls = soft_cross_entropy(p, predicted_logits)
    top1 = m.new_zeros(())
    if not recomputing():
        with torch.no_grad():
            hit = (predicted_logits.argmax(-1) == next_target_logits.argmax(-1)).float()
            top1 = (hit * m).sum()
    n = m.sum()
    return (
        torch.stack([(reg * m).sum(), (cls * (m if weights is None else weights)).sum()]),
        torch.stack([n, n]),
        {"top1": torch.stack([top1, top1])},
    )


def eagle1_regression(predicted: torch.Tensor, next_features: torch.Tensor) -> torch.Tensor:
    """EAGLE-1's feature regression per column `[B, c]`: SmoothL1 (beta 1) averaged over the hidden size."""
    return F.smooth_l1_loss(predicted.float(), next_features.float(), reduction="none").mean(-1)


def eagle3_step_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    t2d: torch.Tensor,
    weights: torch.Tensor | None = None,
    topk: int = 0,
    topk_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One EAGLE-3 TTT step (ALGORITHMS.md 5.2 and 13), as sums.

    Args:
        draft_logits: `[B, T, Vd]`.
        target_logits: `[B, T, V]` already aligned with the step (column t = the target's distribution of the
            token this step predicts).
        loss_mask: `[B, T]` the step's (shifted) mask.
        t2d: `[V]` bool, the draft vocabulary.
        weights: `[B, T]` float per-position loss weights (e.g. D-PACE's); None = the mask.
        topk: HASS's harmonized objective (`draft.hass_topk`): each position's loss adds `topk_weight` times
            -sum p_v log q_v over the k tokens of largest p (renormalised p, as the main term); 0 = off.

    Returns:
        `(loss sum, mask count, correct top-1 count, alpha sum)`. Positions whose target argmax is outside the
        draft vocabulary are dropped from the loss but stay in the count (the reference divides by all
        positions / by sum(mask)); p is renormalised over the draft vocabulary. alpha = sum_v min(p, q) per
        kept position (docs/ALGORITHMS-BLOCK.md 3.4), from the same p and log q as the loss. The top-1 count
        and alpha are 0 while `recomputing()`.
    """
    with torch.no_grad():
        keep = t2d[target_logits.argmax(-1)]
        m = loss_mask.float()
        pm = m * keep.float()
        p = torch.softmax(target_logits[..., t2d].float(), dim=-1)
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    ce = -(p * log_q).sum(-1)  # soft_cross_entropy(p, draft_logits), keeping log q for alpha
    if topk:
        top = p.topk(min(topk, p.shape[-1]), dim=-1)
        ce = ce - topk_weight * (top.values * log_q.gather(-1, top.indices)).sum(-1)
    hit, alpha = m.new_zeros(()), m.new_zeros(())
    if not recomputing():
        with torch.no_grad():
            hit = ((draft_logits.argmax(-1) == p.argmax(-1)).float() * pm).sum()
            alpha = (torch.minimum(p, log_q.exp()).sum(-1) * pm).sum()
    return (ce * (pm if weights is None else pm * weights)).sum(), m.sum(), hit, alpha


def mtp_depth_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    greedy: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> ChunkResult:
    """One MTP depth's cross-entropy on the data's tokens (ALGORITHMS.md 7.1), as sums.

    Args:
        logits: `[B, c, V]` module k's logits; column i predicts t_{i+k+1}.
        labels: `[B, c]` t_{i+k+1}.
        mask: `[B, c]` bool, True where t_{i+k+1} is an answer token.
        greedy: `[B, c]` the target's own greedy choice for the same token.
        weights: `[B, c]` float per-column loss weights (e.g. D-PACE's); None = the mask.

    Returns:
        `(loss sum [1], count [1], {"top1": [1], "agree": [1]})`: agreement with the data's token and with the
        target's greedy token (both 0 while `recomputing()`).
    """
    picked = logits[mask].float()  # [n, V]
    target = labels[mask]
    top1, agree = mtp_hits(logits, labels, mask, greedy)
    ce = F.cross_entropy(picked, target, reduction="sum" if weights is None else "none")
    loss = (ce if weights is None else (ce * weights[mask]).sum()).reshape(1)
    return loss, mask.sum().float().reshape(1), {"top1": top1, "agree": agree}


def mtp_hits(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(top1 [1], agree [1])`: argmax equals the data's / the target's greedy token on `mask` (0 if recomputing)."""
    zero = logits.new_zeros(1, dtype=torch.float32)
    if recomputing():
        return zero, zero
    with torch.no_grad():
        best = logits[mask].argmax(-1)
        return (best == labels[mask]).sum().float().reshape(1), (best == greedy[mask]).sum().float().reshape(
            1
        )
