"""Drafter losses: pure functions returning per-term sums and token counts, computed in fp32.

They know nothing of ranks or gradient accumulation: the training loop divides each term's sum by the
term's token count over the whole accumulation window on all ranks, then applies the term weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


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


def medusa_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Medusa-1 cross-entropy per head (ALGORITHMS.md 2.2), as sums.

    Args:
        logits: `[K, B, T, V]`; head k (1-based, index k-1) at column t predicts x_{t+k+1}.
        input_ids: `[B, T]` the token ids (targets are the ids themselves, shifted by k+1).
        loss_mask: `[B, T]` bool, True on trained (assistant) tokens; indexes the target token.

    Returns:
        `(loss_sums [K], n_tokens [K], metrics)` where metrics holds `top1` and `top5` `[K]`: sums of
        correct predictions over the same positions (divide by `n_tokens` for accuracies).
    """
    K, _, T, _ = logits.shape
    sums, counts, top1, top5 = [], [], [], []
    for i in range(K):
        shift = i + 2  # head i (0-based) predicts x_{t+i+2}
        if shift >= T:
            zero = logits.new_zeros((), dtype=torch.float32)
            sums.append(zero + 0.0 * logits[i].sum())  # keep every head in the graph for DDP
            counts.append(zero)
            top1.append(zero)
            top5.append(zero)
            continue
        lg = logits[i, :, : T - shift].float()  # [B, T-shift, V]
        tgt = input_ids[:, shift:]  # [B, T-shift]
        m = loss_mask[:, shift:]
        ce = F.cross_entropy(lg.transpose(1, 2), tgt, reduction="none")  # [B, T-shift]
        sums.append((ce * m).sum())
        counts.append(m.sum().float())
        with torch.no_grad():
            topk = lg.topk(min(5, lg.shape[-1]), dim=-1).indices  # [B, T-shift, 5]
            hit = topk == tgt.unsqueeze(-1)
            top1.append((hit[..., 0] & m).sum().float())
            top5.append((hit.any(-1) & m).sum().float())
    return torch.stack(sums), torch.stack(counts), {"top1": torch.stack(top1), "top5": torch.stack(top5)}


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
    m = loss_mask.clone()
    m[:, -1] = False
    m = m[:, :-1].float()
    f_tgt = features[:, 1:].float()
    reg = torch.nn.functional.smooth_l1_loss(predicted[:, :-1].float(), f_tgt, reduction="none").mean(-1)
    p = torch.softmax(target_logits[:, 1:].float(), dim=-1)
    cls = soft_cross_entropy(p, predicted_logits[:, :-1])
    with torch.no_grad():
        hit = (predicted_logits[:, :-1].argmax(-1) == target_logits[:, 1:].argmax(-1)).float()
        top1 = (hit * m).sum()
    n = m.sum()
    return (
        torch.stack([(reg * m).sum(), (cls * m).sum()]),
        torch.stack([n, n]),
        {"top1": torch.stack([top1, top1])},
    )


def eagle3_step_loss(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, loss_mask: torch.Tensor, t2d: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One EAGLE-3 TTT step (ALGORITHMS.md 5.2 and 13), as sums.

    Args:
        draft_logits: `[B, T, Vd]`.
        target_logits: `[B, T, V]` already aligned with the step (column t = the target's distribution of the
            token this step predicts).
        loss_mask: `[B, T]` the step's (shifted) mask.
        t2d: `[V]` bool, the draft vocabulary.

    Returns:
        `(loss sum, mask count, correct top-1 count)`. Positions whose target argmax is outside the draft
        vocabulary are dropped from the loss but stay in the count (the reference divides by all positions
        / by sum(mask)); p is renormalised over the draft vocabulary.
    """
    with torch.no_grad():
        keep = t2d[target_logits.argmax(-1)]
        m = loss_mask.float()
        pm = m * keep.float()
        p = torch.softmax(target_logits[..., t2d].float(), dim=-1)
    ce = soft_cross_entropy(p, draft_logits)
    with torch.no_grad():
        hit = (draft_logits.argmax(-1) == p.argmax(-1)).float() * pm
    return (ce * pm).sum(), m.sum(), hit.sum()


# ---------------------------------------------------------------------------------------------------------
# Draft-LM distillation (ALGORITHMS.md section 8): divergences between the target p and the draft q.

DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")


def _divergence_chunk(
    t_chunk: torch.Tensor,
    d_chunk: torch.Tensor,
    lse_t: torch.Tensor,
    lse_d: torch.Tensor,
    kind: str,
    beta: float,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One vocabulary slice `[N, C]`: its contribution `[N]` to the divergence and to sum_v min(p, q)."""
    log_p = t_chunk.float() / temperature - lse_t[:, None]
    log_q = d_chunk.float() / temperature - lse_d[:, None]
    p, q = log_p.exp(), log_q.exp()
    if kind == "fkl":  # KL(p || q): mode-covering
        div = p * (log_p - log_q)
    elif kind == "rkl":  # KL(q || p): mode-seeking
        div = q * (log_q - log_p)
    elif kind == "jsd":  # beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q
        log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log(1.0 - beta))
        div = beta * p * (log_p - log_m) + (1.0 - beta) * q * (log_q - log_m)
    elif kind == "tvd":  # 1/2 sum |p - q| = 1 - sum min(p, q)
        div = 0.5 * (p - q).abs()
    else:
        raise ValueError(f"unknown divergence {kind!r}: use one of {', '.join(DIVERGENCES)}")
    # Terms with p = 0 (or q = 0) are 0 * finite here: log-softmax never returns -inf for finite logits.
    return div.sum(-1), torch.minimum(p, q).detach().sum(-1)


def divergence(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    kind: str,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    vocab_chunk: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position divergence D(p || q) `[N]` and expected acceptance sum_v min(p, q) `[N]` (no gradient).

    p = softmax(target_logits / T) (the target; never gets a gradient), q = softmax(draft_logits / T): the
    same temperature on both, as verification at temperature T sees them (ALGORITHMS.md 8.1). `kind`:
    fkl = KL(p||q), rkl = KL(q||p), jsd = generalised JSD with weight `beta` on p (0 < beta < 1; use fkl /
    rkl for the end points), tvd = total variation, whose minimum is exactly maximal acceptance.

    Computed in float32 over vocabulary slices of `vocab_chunk` columns, each recomputed in the backward
    (activation checkpointing), so no `[N, V]` float32 intermediate beyond one slice is ever kept.

    Args:
        target_logits: `[N, V]` target logits (any float dtype).
        draft_logits: `[N, V]` draft logits, same vocabulary.
    """
    if target_logits.shape != draft_logits.shape or target_logits.dim() != 2:
        raise ValueError(
            f"divergence needs [N, V] logits of one shape, got {tuple(target_logits.shape)} and "
            f"{tuple(draft_logits.shape)}"
        )
    if kind == "jsd" and not 0.0 < beta < 1.0:
        raise ValueError(f"jsd needs 0 < beta < 1, got {beta}; beta 0 / 1 are fkl / rkl")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    target_logits = target_logits.detach()
    lse_t = torch.logsumexp(target_logits.float() / temperature, dim=-1)
    lse_d = torch.logsumexp(draft_logits.float() / temperature, dim=-1)
    div = draft_logits.new_zeros(draft_logits.shape[0], dtype=torch.float32)
    accept = torch.zeros_like(div)
    for start in range(0, draft_logits.shape[1], vocab_chunk):
        cols = slice(start, start + vocab_chunk)
        args = (target_logits[:, cols], draft_logits[:, cols], lse_t, lse_d, kind, beta, temperature)
        if draft_logits.requires_grad:
            d, a = torch.utils.checkpoint.checkpoint(_divergence_chunk, *args, use_reentrant=False)
        else:
            d, a = _divergence_chunk(*args)
        div, accept = div + d, accept + a
    return div, accept
