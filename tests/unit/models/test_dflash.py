"""DFlash (docs/ALGORITHMS-BLOCK.md section 1): the block mask against a rule written out loop by loop, the
training forward against the cached inference pass, the label alignment, the anchors, the per-slot loss
against a float64 reference, the default taps and the mask token."""

from __future__ import annotations

import types

import pytest
import torch
from conftest import make_tiny_llama
from transformers import DynamicCache

from draftsmith.eval.kv_cache import crop_to
from draftsmith.models.block_losses import block_slot_loss, block_targets, row_seeds, sample_anchors
from draftsmith.models.dflash import (
    DFlashConfig,
    DFlashDraft,
    block_mask,
    default_feature_layers,
    pick_mask_token,
)

V, MASK = 50, 7


@pytest.fixture(scope="module")
def draft() -> DFlashDraft:
    target = make_tiny_llama(V, layers=4, hidden=32)
    torch.manual_seed(1)
    d = DFlashDraft(
        DFlashConfig(block_size=4, num_layers=2, feature_layers=[1, 3], mask_token_id=MASK), target.config, V
    )
    with torch.no_grad():  # away from the identity-ish init, so that a wrong mask or position shows
        for name, p in d.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    d.attach_target(target.get_input_embeddings(), target.get_output_embeddings())
    return d.eval()


def reference_mask(anchors: list[int], keep: list[bool], S: int, B: int) -> torch.Tensor:
    """The rule, one query and one key at a time."""
    N = len(anchors)
    out = torch.zeros(N * B, S + N * B, dtype=torch.bool)
    for j in range(N):
        for k in range(B):
            for t in range(S):
                out[j * B + k, t] = keep[j] and t < anchors[j]
            for kv in range(N * B):
                out[j * B + k, S + kv] = kv // B == j
    return out


def test_block_mask_equals_the_rule_written_out():
    anchors, keep = [0, 3, 3, 9], [True, True, False, True]
    got = block_mask(torch.tensor([anchors]), torch.tensor([keep]), 12, 4)
    assert got.shape == (1, 1, 16, 28)
    assert torch.equal(got[0, 0], reference_mask(anchors, keep, 12, 4))
    # invariants: no query sees its own anchor's context row or anything after it; every slot sees its whole block
    m = got[0, 0]
    for j, a in enumerate(anchors):
        assert not m[j * 4 : (j + 1) * 4, a:12].any()
        assert m[j * 4 : (j + 1) * 4, 12 + j * 4 : 12 + (j + 1) * 4].all()


def test_the_training_forward_equals_the_cached_inference_pass(draft):
    """Slot outputs of each block in the batched training forward equal one inference pass over the context
    before its anchor (fed in two cache chunks, the block rows cropped between them)."""
    g = torch.Generator().manual_seed(3)
    S = 14
    ids = torch.randint(0, V, (1, S), generator=g)
    feats = torch.randn(1, S, 64, generator=g)
    anchors = [0, 4, 5, 10]
    with torch.no_grad():
        out = draft(feats, ids, torch.tensor([anchors]), torch.ones(1, 4, dtype=torch.bool))
        for j, a in enumerate(anchors):
            cache = DynamicCache()
            ctx = draft.context(feats[:, :a])
            blk = torch.tensor([[int(ids[0, a]), MASK, MASK, MASK]])
            pos = torch.arange(a, a + 4)[None]
            split = a // 2
            if split:
                draft.run(ctx[:, :split], torch.arange(split)[None], blk, pos, None, cache)
                crop_to(cache, split)
            got = draft.run(ctx[:, split:], torch.arange(split, a)[None], blk, pos, None, cache)
            torch.testing.assert_close(got, out[:, j * 4 : (j + 1) * 4], atol=1e-5, rtol=1e-5)
            assert cache.get_seq_length() == a + 4  # context rows + this block's rows, until cropped


def test_a_block_never_reads_the_anchor_feature_or_later_ones(draft):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, V, (1, 10), generator=g)
    feats = torch.randn(1, 10, 64, generator=g)
    anchors, keep = torch.tensor([[2, 6]]), torch.ones(1, 2, dtype=torch.bool)
    with torch.no_grad():
        base = draft(feats, ids, anchors, keep)
        changed = feats.clone()
        changed[:, 6:] += 5.0  # features at and after the second anchor
        moved = draft(changed, ids, anchors, keep)
    torch.testing.assert_close(moved, base)


def test_labels_are_the_data_tokens_at_anchor_plus_slot():
    ids = torch.arange(100, 110)[None]
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    anchors, keep = torch.tensor([[1, 5, 8, 0]]), torch.tensor([[True, True, True, False]])
    labels, valid, columns = block_targets(ids, mask, anchors, keep, 4)
    assert labels[0, 0].tolist() == [102, 103, 104]  # slot k of the block at 1 predicts x_{1+k}
    assert valid[0, 0].tolist() == [True, True, True]
    assert valid[0, 1].tolist() == [False, True, True]  # x_6 is not trained
    assert valid[0, 2].tolist() == [True, False, False]  # x_10, x_11 are past the end
    assert not valid[0, 3].any()  # a padding block
    assert columns[0, 0].tolist() == [1, 2, 3]  # the target's distribution over x_{a+k} sits at column a+k-1


def test_anchors_have_a_trained_next_token_and_rows_draw_independently():
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[0, 5:15] = True  # 10 candidates: a = 4..13
    mask[1, 18:] = True  # 2 candidates: a = 17, 18
    anchors, keep = sample_anchors(mask, 6, [11, 12, 13])
    assert anchors.shape == (3, 6)
    assert keep.sum(1).tolist() == [6, 2, 0]
    kept0 = anchors[0][keep[0]].tolist()
    assert kept0 == sorted(kept0) and len(set(kept0)) == 6 and all(4 <= a <= 13 for a in kept0)
    assert anchors[1][keep[1]].tolist() == [17, 18]
    assert (anchors[~keep] == 0).all()
    alone, _ = sample_anchors(mask[:1], 6, [11])
    assert torch.equal(alone[0], anchors[0])  # a row draws the same blocks in any batch (resume, DDP, accum)
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(0))
    assert row_seeds(ids, 3) == row_seeds(ids.flip(0), 3)[::-1]  # seeded by the row's tokens, not its index
    assert row_seeds(ids, 3) != row_seeds(ids, 4)


def reference_slot_loss(draft_logits, labels, valid, target_logits, kind):
    q = draft_logits.double().log_softmax(-1)
    if kind == "ce":
        per = -q.gather(-1, labels[..., None])[..., 0]
    else:  # KL(p || q)
        p = target_logits.double().softmax(-1)
        per = (p * (p.log() - q)).sum(-1)
    return (per * valid).sum(dim=(0, 1))


@pytest.mark.parametrize("kind", ["ce", "kl"])
def test_slot_loss_equals_a_float64_reference(kind):
    g = torch.Generator().manual_seed(5)
    d, t = torch.randn(2, 3, 4, 11, generator=g), torch.randn(2, 3, 4, 11, generator=g)
    labels = torch.randint(0, 11, (2, 3, 4), generator=g)
    valid = torch.rand(2, 3, 4, generator=g) > 0.3
    sums, counts, _ = block_slot_loss(d, labels, valid, t, kind)
    torch.testing.assert_close(
        sums.double(), reference_slot_loss(d, labels, valid, t, kind), atol=1e-5, rtol=1e-6
    )
    assert counts.tolist() == valid.sum(dim=(0, 1)).float().tolist()


def test_prefix_counts_only_blocks_right_up_to_the_slot():
    # one block, 3 slots; the target's argmax is token 0 everywhere; the draft is right at slots 1 and 3 only
    target = torch.zeros(1, 1, 3, 4)
    target[..., 0] = 5.0
    draft = torch.zeros(1, 1, 3, 4)
    draft[0, 0, 0, 0] = draft[0, 0, 2, 0] = 5.0
    draft[0, 0, 1, 2] = 5.0
    _, _, m = block_slot_loss(
        draft, torch.zeros(1, 1, 3, dtype=torch.long), torch.ones(1, 1, 3, dtype=torch.bool), target, "ce"
    )
    assert m["top1"].tolist() == [1.0, 0.0, 1.0]
    assert m["prefix"].tolist() == [1.0, 0.0, 0.0]  # slot 3 is right, but the chain broke at slot 2
    p = torch.softmax(target[0, 0], -1)
    q = torch.softmax(draft[0, 0], -1)
    torch.testing.assert_close(m["alpha"], torch.minimum(p, q).sum(-1))


def test_default_taps_are_z_labs_outputs_plus_one():
    assert default_feature_layers(36, 5) == [2, 10, 18, 26, 34]  # Qwen3-8B: outputs 1, 9, 17, 25, 33
    assert default_feature_layers(32, 1) == [17]
    with pytest.raises(ValueError, match="draft.feature_layers"):
        default_feature_layers(4, 3)


def test_the_mask_token_follows_the_documented_order():
    class Tok(types.SimpleNamespace):
        def __len__(self) -> int:
            return 10

    plain = Tok(mask_token_id=None, pad_token_id=3, eos_token_id=1, unk_token_id=None)
    assert pick_mask_token(plain, 12) == 10  # the first embedding row no token uses
    assert pick_mask_token(plain, 10) == 3  # no spare row: pad
    assert pick_mask_token(Tok(mask_token_id=5, pad_token_id=3, eos_token_id=1, unk_token_id=None), 12) == 5
    assert pick_mask_token(plain, 12, explicit=8) == 8
    with pytest.raises(ValueError, match="draft.mask_token_id"):
        pick_mask_token(Tok(mask_token_id=None, pad_token_id=None, eos_token_id=None, unk_token_id=None), 10)


def test_dpace_weights_reach_the_slot_loss():
    """dpace_alpha = 1: slot j of a fully valid block weighs K - j + 1 (the valid slots from j on); tv sums
    1 - alpha."""
    g = torch.Generator().manual_seed(6)
    d, t = torch.randn(2, 3, 4, 9, generator=g), torch.randn(2, 3, 4, 9, generator=g)
    labels = torch.randint(0, 9, (2, 3, 4), generator=g)
    valid = torch.ones(2, 3, 4, dtype=torch.bool)
    plain = reference_slot_loss(d, labels, valid, t, "ce")
    sums, _, _ = block_slot_loss(d, labels, valid, t, "ce", dpace_alpha=1.0)
    torch.testing.assert_close(sums.double(), plain * torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    tv, _, m = block_slot_loss(d, labels, valid, t, "tv")
    torch.testing.assert_close(tv, valid.float().sum(dim=(0, 1)) - m["alpha"])
