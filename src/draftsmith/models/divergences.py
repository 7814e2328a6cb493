"""Draft-LM distillation (ALGORITHMS.md section 8): divergences between the target's distribution p and the
draft's q, per position, in float32 over vocabulary slices; and the distillation loss of a chunk as sums."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from .chunking import ChunkResult, recomputing

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
    # Under no_grad, not `.detach()`: a recorded op would keep its (recomputed) p and q until backward ends.
    with torch.no_grad():
        accept = torch.minimum(p, q).sum(-1)
    return div.sum(-1), accept


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


def distill_loss(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    labels: torch.Tensor,
    kind: str,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    vocab_chunk: int = 8192,
) -> ChunkResult:
    """Distillation on N trained positions, as sums: `divergence` of `kind` (fkl | rkl | jsd | tvd), or
    `ce`, the draft's cross-entropy on the data's tokens (the baseline; no target gradient anyway).

    Args:
        target_logits: `[N, V]` the target's logits (no gradient).
        draft_logits: `[N, V]` the draft's logits.
        labels: `[N]` the data's next tokens (used by `ce` only).

    Returns:
        `(loss sum [1], N [1], {"accept": [1], "top1": [1]})`: accept sums the expected acceptance
        sum_v min(p, q) at `temperature`, top1 counts argmax(q) == argmax(p) (both 0 while `recomputing()`
        for `ce`, and top1 for every kind).
    """
    zero = draft_logits.new_zeros(1, dtype=torch.float32)
    if kind == "ce":
        loss = F.cross_entropy(draft_logits.float(), labels, reduction="sum")
        accept = zero
        if not recomputing():
            with torch.no_grad():
                accept = divergence(target_logits, draft_logits, "tvd", temperature=temperature)[1].sum()
    else:
        per_token, per_accept = divergence(
            target_logits, draft_logits, kind, beta=beta, temperature=temperature, vocab_chunk=vocab_chunk
        )
        loss, accept = per_token.sum(), per_accept.sum()
    top1 = zero
    if not recomputing():
        with torch.no_grad():
            top1 = (draft_logits.argmax(-1) == target_logits.argmax(-1)).sum().float()
    n = zero + draft_logits.shape[0]
    return loss.reshape(1), n, {"accept": accept.reshape(1), "top1": top1.reshape(1)}
