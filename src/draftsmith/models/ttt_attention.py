"""EAGLE-3's training-time-test attention without a materialised mask.

At TTT step s the queries (column t) attend to the step-0 keys at columns <= t and to their own column's keys
of steps 1..s (ALGORITHMS.md 5.2). As an explicit mask that is `[T, (s+1)T]` per step, and SDPA turns a
boolean mask into an additive float one that it keeps for the backward pass: 4 (s+1) T^2 bytes per step,
112 T^2 bytes over 7 steps (1.9 GB at T = 4,096), the only thing in a training step that grew with T^2 apart
from attention itself.

Here the step-0 part runs as SDPA with `is_causal=True` (a fused kernel on CPU and GPU: no T x T tensor
is kept) and the s diagonal keys are merged into its softmax exactly. The merge needs the causal part's
normaliser Z_t = sum_{j<=t} exp(score_tj), which SDPA does not return, so one extra "sink" key rides along:
it scores m_t for query t (through one extra head dimension) and carries value e_d (an extra value dimension),
so the extra output channel reads r_t = e^{m_t} / (Z_t + e^{m_t}). With the diagonal scores d_tj:

    out_t = (o_t + sum_j exp(d_tj - m_t) r_t v_tj) / (1 - r_t + sum_j exp(d_tj - m_t) r_t)

where o_t is the sink-diluted causal output. This is the exact softmax over all s + T' keys for any m_t; m_t
is the largest of the query's own step-0 score and its diagonal scores (no gradient: the result does not
depend on it), which keeps every exponent <= 0 and the denominator >= 1/2, so nothing overflows or cancels.

Written here rather than with `flex_attention` because that one is fused only under `torch.compile`; eager
it materialises the full score matrix.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION_NAME = "draftsmith_ttt"


class TTTPattern:
    """Passed as the attention mask of a TTT step: keys are the cached steps in order, step 0 causal and
    every later step its diagonal only (`eagle3.ttt_mask` is the same pattern as a tensor)."""

    def __repr__(self) -> str:
        return "TTT_PATTERN"


TTT_PATTERN = TTTPattern()


def ttt_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Attention of `query [B, h, T, d]` over `key / value [B, hk, (s+1) T, d]` with the TTT pattern.

    Returns:
        `[B, h, T, d]`, equal to SDPA with `eagle3.ttt_mask(T, s)` (to float rounding).
    """
    B, h, T, d = query.shape
    hk, total = key.shape[1], key.shape[2]
    if total % T:
        raise ValueError(f"TTT keys must be whole steps of {T} columns, got {total}")
    steps = total // T
    k0, v0 = key[:, :, :T], value[:, :, :T]
    if steps == 1:
        return F.scaled_dot_product_attention(
            query, k0, v0, is_causal=True, scale=scaling, enable_gqa=h != hk
        )
    group = h // hk
    per_head = (lambda x: x.repeat_interleave(group, dim=1)) if group > 1 else (lambda x: x)
    # Scores the sink must not exceed by much: the query's own step-0 key and its diagonal keys.
    diag = torch.stack(
        [(query * per_head(key[:, :, j * T : (j + 1) * T])).sum(-1) * scaling for j in range(steps)], dim=-1
    )  # [B, h, T, steps]: column 0 is the own step-0 score (in the causal part), 1.. the diagonal keys
    m = diag.detach().amax(-1)  # [B, h, T]
    # One zero query row and one sink key in front: under is_causal, query t+1 then sees the sink and keys 0..t.
    q = F.pad(torch.cat([query, (m / scaling).unsqueeze(-1)], dim=-1), (0, 0, 1, 0))
    sink_k = F.pad(key.new_ones(B, hk, 1, 1), (d, 0))  # [0, ..., 0, 1]: scores m_t against q's last dimension
    sink_v = sink_k
    k = torch.cat([sink_k, F.pad(k0, (0, 1))], dim=2)
    v = torch.cat([sink_v, F.pad(v0, (0, 1))], dim=2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=h != hk)[:, :, 1:]
    r = o[..., d:]  # [B, h, T, 1]
    w = torch.exp(diag[..., 1:] - m.unsqueeze(-1)) * r  # [B, h, T, steps - 1]
    num = o[..., :d] + sum(
        w[..., j - 1 : j] * per_head(value[:, :, j * T : (j + 1) * T]) for j in range(1, steps)
    )
    return num / (1.0 - r + w.sum(-1, keepdim=True))


def draft_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The draft layer's attention: the TTT pattern as above, any other mask through transformers' SDPA."""
    if not isinstance(attention_mask, TTTPattern):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout:
        raise ValueError("the TTT attention has no dropout; the draft layer's attention_dropout must be 0")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = ttt_attention(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, draft_attention_forward)
