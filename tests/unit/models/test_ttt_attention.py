"""EAGLE-3's mask-free TTT attention against SDPA with the explicit `ttt_mask` (the oracle): the same outputs
and gradients, with grouped KV heads, at every step count, and with scores far from zero either way."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.eagle3 import ttt_mask
from draftsmith.models.ttt_attention import TTT_PATTERN, draft_attention_forward, ttt_attention


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    T, steps = q.shape[2], k.shape[2] // q.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ttt_mask(T, steps - 1), scale=scale)


def inputs(
    heads: int, kv_heads: int, T: int, steps: int, magnitude: float, seed: int = 0, dtype=torch.float64
):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, T, 8, generator=g, dtype=dtype) * magnitude
    k = torch.randn(2, kv_heads, steps * T, 8, generator=g, dtype=dtype) * magnitude
    v = torch.randn(2, kv_heads, steps * T, 8, generator=g, dtype=dtype)
    return [x.requires_grad_() for x in (q, k, v)]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


@pytest.mark.parametrize("steps", [1, 2, 7])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2)])
@pytest.mark.parametrize("magnitude", [1.0, 4.0])
def test_equals_sdpa_with_the_explicit_mask(steps, heads, kv_heads, magnitude):
    """magnitude 4: scores of about +-40, where a sink scoring 0 would underflow or swamp the sum."""
    q, k, v = inputs(heads, kv_heads, 9, steps, magnitude)
    scale = 8**-0.5
    got, want = ttt_attention(q, k, v, scale), oracle(q, k, v, scale)
    assert max_err(got, want) < 1e-12
    probe = torch.randn_like(want)
    g_got = torch.autograd.grad((got * probe).sum(), (q, k, v))
    g_want = torch.autograd.grad((want * probe).sum(), (q, k, v))
    for a, b in zip(g_got, g_want, strict=True):
        assert max_err(a, b) < 1e-10 * max(1.0, float(b.abs().max()))


def test_float32_scores_beyond_exp_range():
    """Scores up to ~150 in float32: exp(score) overflows there, so a sink scoring a constant 0 would give
    inf / nan. Against the float64 result, the error is that of float32 SDPA with the explicit mask."""
    q, k, v = inputs(4, 2, 16, 7, 20.0)
    scale = 8**-0.5
    assert (
        float((q @ k.repeat_interleave(2, 1).transpose(-1, -2)).amax() * scale) > 100
    )  # as extreme as claimed
    exact = oracle(q, k, v, scale)
    q32, k32, v32 = (x.detach().float() for x in (q, k, v))
    got, sdpa32 = ttt_attention(q32, k32, v32, scale), oracle(q32, k32, v32, scale)
    assert torch.isfinite(got).all()
    assert max_err(got.double(), exact) <= 2 * max_err(sdpa32.double(), exact) + 1e-6


def test_own_column_dominated_by_a_diagonal_key():
    """A query whose later-step diagonal key outscores every step-0 key by ~60 (r_t close to 1)."""
    q, k, v = inputs(2, 2, 5, 3, 1.0, seed=3)
    with torch.no_grad():
        k[:, :, 5:10] = q * 30  # step-1 diagonal scores ~ 30 |q|^2 / sqrt(8)
    scale = 8**-0.5
    assert max_err(ttt_attention(q, k, v, scale), oracle(q, k, v, scale)) < 1e-12


def test_other_masks_go_to_sdpa_unchanged():
    """The registered attention only intercepts the TTT pattern; a tensor mask gives transformers' SDPA."""
    q, k, v = (x.detach().float() for x in inputs(2, 2, 4, 1, 1.0))
    module: Any = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 1
    mask = torch.rand(1, 1, 4, 4) > 0.3
    mask[..., 0] = True
    out, _ = draft_attention_forward(module, q, k, v, mask, scaling=0.5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5).transpose(1, 2)
    assert torch.equal(out, want)
    ttt, _ = draft_attention_forward(module, q, k, v, TTT_PATTERN, scaling=0.5)
    assert torch.allclose(
        ttt, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5).transpose(1, 2)
    )
