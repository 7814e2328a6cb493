"""Draft attention masks are boolean (True = attend) and reach transformers' SDPA attention as such, or are
implicit (EAGLE-3's TTT pattern); the eager attention, which would add a boolean mask to the scores instead of
masking them, is never used."""

from __future__ import annotations

import pytest
import torch
import transformers.models.llama.modeling_llama as llama_modeling
from conftest import make_tiny_llama

from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, ttt_mask
from draftsmith.models.mtp import MTPConfig, MTPDraft
from draftsmith.models.parts import causal_mask

V, H, T = 40, 32, 6


@pytest.fixture(scope="module")
def llama():
    return make_tiny_llama(V, layers=4, hidden=H)


@pytest.fixture()
def sdpa_masks(monkeypatch):
    """The masks every SDPA call receives; the eager attention raises if anything calls it."""
    seen: list[torch.Tensor | None] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    def eager(*args, **kwargs):
        raise AssertionError("the eager attention ran")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(llama_modeling, "eager_attention_forward", eager)
    return seen


def additive(mask: torch.Tensor) -> torch.Tensor:
    """The old float mask of a boolean one: 0 where allowed, float32 min elsewhere."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def test_masks_are_boolean_with_the_documented_pattern():
    c = causal_mask(4)[0, 0]
    assert c.dtype == torch.bool and c.tolist() == [[j <= i for j in range(4)] for i in range(4)]
    m = ttt_mask(3, 2)[0, 0]
    assert m.dtype == torch.bool and m.shape == (3, 9)
    assert torch.equal(m[:, :3], c[:3, :3]) and torch.equal(m[:, 3:6], torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("layers", [1, 2])
def test_eagle3_unroll_runs_the_ttt_pattern_without_a_mask_tensor(llama, sdpa_masks, monkeypatch, layers):
    """Every TTT step reaches SDPA with no mask tensor (a causal kernel plus the diagonal keys), and the
    unrolled outputs and gradients equal those of the same draft fed the explicit boolean `ttt_mask` (in
    every layer: draft.num_layers=2 runs the pattern in its second layer too)."""
    torch.manual_seed(0)
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=3, num_layers=layers)
    draft = Eagle3Draft(cfg, llama.config, V)
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    feats, ids = torch.randn(1, T, 3 * H), torch.randint(0, V, (1, T))
    got = torch.stack(draft.unroll_hidden(feats, ids))
    assert len(sdpa_masks) == 3 * layers and all(m is None for m in sdpa_masks)
    params = [p for name, p in draft.named_parameters() if not name.startswith(("lm_head_d", "norm_final"))]
    grads = torch.autograd.grad(got.square().sum(), params)

    step, calls = draft.step, iter(range(3))

    def explicit(hidden, ids, positions, mask, cache):
        return step(hidden, ids, positions, ttt_mask(ids.shape[1], next(calls)), cache)

    monkeypatch.setattr(draft, "step", explicit)
    want = torch.stack(draft.unroll_hidden(feats, ids))
    shapes = [(1, 1, T, (s + 1) * T) for s in range(3) for _ in range(layers)]
    assert [m.shape for m in sdpa_masks[3 * layers :]] == shapes
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, torch.autograd.grad(want.square().sum(), params), strict=True):
        # float32 summation order differs between the two kernels with the thread count: one element in
        # thousands lands ~2e-6 apart at OMP_NUM_THREADS=1; a wrong mask moves gradients by orders more.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_eagle1_and_mtp_pass_a_boolean_causal_mask_equal_to_the_additive_one(llama, sdpa_masks):
    torch.manual_seed(0)
    e1 = Eagle1Draft(EagleConfig(version=1), llama.config, V).eval()
    e1.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    f, ids = torch.randn(1, T, H), torch.randint(0, V, (1, T))
    out = e1(f, ids)
    assert sdpa_masks[-1].dtype == torch.bool and torch.equal(sdpa_masks[-1], causal_mask(T))
    old = e1(f, ids, torch.arange(T)[None], additive(causal_mask(T)))
    torch.testing.assert_close(out, old, rtol=0, atol=0)
    mtp = MTPDraft(MTPConfig(num_modules=2), llama.config, V).eval()
    mtp.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    sdpa_masks.clear()
    mtp(f, ids)
    assert len(sdpa_masks) == 2 and all(m.dtype == torch.bool for m in sdpa_masks)
