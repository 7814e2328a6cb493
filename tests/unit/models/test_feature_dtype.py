"""Every hidden-state drafter trained without autocast (`train.mixed_precision=no`) beside a bfloat16 target
or cache: a float32 draft reads bfloat16 features as their float32 values, and its outputs reach the target's
bfloat16 LM head in the head's dtype. Before this held, EAGLE-1, MTP, DFlash and Medusa stopped on the first
training step with a dtype mismatch."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from conftest import make_tiny_llama

from draftsmith.models.dflash import DFlashConfig, DFlashDraft
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.mtp import MTPConfig, MTPDraft
from draftsmith.models.peagle import PEagleConfig, PEagleDraft

V, H, T = 48, 32, 9
ANCHORS, KEEP = torch.tensor([[1, 4]]), torch.tensor([[True, True]])
DEPTHS, VALID = torch.tensor([[0, 1]]), torch.tensor([[True, True]])

# family -> (a float32 draft for `target_config`, the width of its features, its training forward to logits)
Family = tuple[Callable[[object], torch.nn.Module], int, Callable[..., torch.Tensor]]
FAMILIES: dict[str, Family] = {
    "medusa": (lambda c: MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), H, V), H, lambda d, f, i: d(f)),
    "eagle1": (
        lambda c: Eagle1Draft(EagleConfig(version=1), c, V),
        H,
        lambda d, f, i: d.logits(d(f, i)),
    ),
    "eagle3": (
        lambda c: Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=2), c, V),
        3 * H,
        lambda d, f, i: torch.stack(d.unroll(f, i)),
    ),
    "mtp": (lambda c: MTPDraft(MTPConfig(num_modules=2), c, V), H, lambda d, f, i: torch.stack(d(f, i))),
    "dflash": (
        lambda c: DFlashDraft(DFlashConfig(block_size=3, feature_layers=[1, 3], mask_token_id=7), c, V),
        2 * H,
        lambda d, f, i: d.logits(d(f, i, ANCHORS, KEEP)),
    ),
    "peagle": (
        lambda c: PEagleDraft(
            PEagleConfig(feature_layers=[1, 2, 3], num_depths=2, mask_token_id=7, mask_embedding="learned"),
            c,
            V,
        ),
        3 * H,
        lambda d, f, i: d.logits(d(f, i, ANCHORS, DEPTHS, VALID)),
    ),
}


def _randomized(draft: torch.nn.Module) -> torch.nn.Module:
    """Away from the zero / identity initialisations, so that every input moves the output."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g) + (1.0 if p.ndim == 1 else 0.0))
    return draft.eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.no_grad()
def test_a_float32_draft_on_a_bfloat16_target_computes_on_the_features_values(family):
    build, width, forward = FAMILIES[family]
    llama = make_tiny_llama(V, layers=4, hidden=H)
    draft = _randomized(build(llama.config))
    attach = getattr(draft, "attach_target", None)
    if attach is not None:
        attach(llama.get_input_embeddings(), llama.get_output_embeddings())
    g = torch.Generator().manual_seed(2)
    features = torch.randn(1, T, width, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, V, (1, T), generator=g)

    # Exact: bfloat16 features are float32 values; the draft computes on them in float32.
    got = forward(draft, features, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, forward(draft, features.float(), ids), atol=0, rtol=0)
    if attach is None:
        return  # Medusa's heads carry their own vocabulary projection

    # A bfloat16 target's frozen embedding and head: against the same rounded weights in float32, the only
    # difference is the head's bfloat16 product (relative rounding 2^-8 per operand).
    half = copy.deepcopy(llama).to(torch.bfloat16)
    attach(half.get_input_embeddings(), half.get_output_embeddings())
    got = forward(draft, features, ids)
    rounded = half.float()
    attach(rounded.get_input_embeddings(), rounded.get_output_embeddings())
    want = forward(draft, features.float(), ids)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.02)
