"""EAGLE-1 / EAGLE-3 against the checklist of ALGORITHMS.md sections 1.3, 5.2, 11 and 13."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_llama

from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import (
    Eagle3Draft,
    build_vocab_map,
    default_feature_layers,
    resolve_draft_vocab,
    ttt_mask,
)
from draftsmith.models.losses import eagle1_loss, eagle3_step_loss, soft_cross_entropy
from draftsmith.models.parts import causal_mask, shift_left
from draftsmith.train.eagle import step_masks

V, T = 48, 7


@pytest.fixture(scope="module")
def llama():
    return make_tiny_llama(V, layers=4, hidden=32)


def eagle3(llama, steps: int = 4, vd: int = V, layers: int = 1) -> Eagle3Draft:
    torch.manual_seed(0)
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=steps, num_layers=layers)
    draft = Eagle3Draft(cfg, llama.config, vd).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    return draft


def eagle1(llama) -> Eagle1Draft:
    torch.manual_seed(0)
    draft = Eagle1Draft(EagleConfig(version=1), llama.config, V).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    return draft


def test_ttt_mask_equals_brute_force_reconstruction():
    for step in range(4):
        mask = ttt_mask(T, step)[0, 0]
        assert mask.dtype == torch.bool
        for t in range(T):
            for key in range((step + 1) * T):
                j, c = divmod(key, T)
                expected = c <= t if j == 0 else c == t
                assert bool(mask[t, key]) == expected, (step, t, key)


@pytest.mark.parametrize("layers", [1, 2])
@torch.no_grad()
def test_ttt_unroll_equals_a_chain_of_drafts_at_inference(llama, layers):
    """Oracle (5.2): TTT step s at column t == drafting a chain at inference: a causal pass over the real
    pairs 0..t, then s single-token steps feeding the draft's own output, each seeing the prefix and its
    own ancestors through the cache (with draft.num_layers=2, every layer through its own slot)."""
    from transformers import DynamicCache

    draft = eagle3(llama, layers=layers)
    g = torch.randn(1, T, 3 * 32)
    ids = torch.randint(0, V, (1, T))
    steps = draft.unroll(g, ids)
    nxt = shift_left(ids)
    for t in range(T):
        cache = DynamicCache()
        h = draft.step(
            draft.project(g[:, : t + 1]),
            nxt[:, : t + 1],
            torch.arange(t + 1)[None],
            causal_mask(t + 1),
            cache,
        )[:, -1:]
        torch.testing.assert_close(draft.logits(h)[0, 0], steps[0][0, t], atol=1e-5, rtol=1e-5)
        for s in range(1, len(steps)):
            token = ids[:, t + s + 1 : t + s + 2] if t + s + 1 < T else torch.zeros(1, 1, dtype=torch.long)
            allowed = torch.zeros(1, 1, 1, cache.get_seq_length() + 1)
            h = draft.step(h, token, torch.tensor([[t + s]]), allowed, cache)
            torch.testing.assert_close(draft.logits(h)[0, 0], steps[s][0, t], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_shift_table_column_t_sees_only_its_past(llama):
    """Table 1.3: EAGLE-1 column t reads (f_t, x_{t+1}); EAGLE-3 step s column t reads g_{<=t} and x_{<=t+s+1}."""
    g = torch.randn(1, T, 3 * 32)
    ids = torch.randint(0, V, (1, T))
    d3 = eagle3(llama)
    base = d3.unroll(g, ids)
    t = 2
    for s in range(len(base)):
        later = ids.clone()
        later[0, t + s + 2 :] = (later[0, t + s + 2 :] + 1) % V  # tokens after x_{t+s+1}
        g2 = g.clone()
        g2[0, t + 1 :] += 1.0  # features after column t
        torch.testing.assert_close(d3.unroll(g2, later)[s][0, t], base[s][0, t])
        own = ids.clone()
        own[0, t + s + 1] = (own[0, t + s + 1] + 1) % V  # the token this column reads at step s
        assert not torch.allclose(d3.unroll(g, own)[s][0, t], base[s][0, t])
    d1 = eagle1(llama)
    f = torch.randn(1, T, 32)
    nxt = shift_left(ids)  # the recipe feeds x_{t+1} at column t
    out = d1(f, nxt)
    f2, n2 = f.clone(), nxt.clone()
    f2[0, t + 1 :] += 1.0
    n2[0, t + 1 :] = (n2[0, t + 1 :] + 1) % V  # x_{t+2} and later
    torch.testing.assert_close(d1(f2, n2)[0, t], out[0, t])
    n3 = nxt.clone()
    n3[0, t] = (n3[0, t] + 1) % V  # x_{t+1} itself
    assert not torch.allclose(d1(f, n3)[0, t], out[0, t])


def test_step_masks_hand_built():
    batch = {
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 0]], dtype=torch.bool),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]]),  # the last column is padding
    }
    s0, s1, s2 = (m.int().tolist()[0] for m in step_masks(batch, 3))
    # step s, column t: token x_{t+s} trained and position t+s+1 (the label's distribution) real
    assert s0 == [0, 0, 1, 1, 0, 0]
    assert s1 == [0, 1, 1, 0, 0, 0]
    assert s2 == [1, 1, 0, 0, 0, 0]


def test_vocab_map_round_trip():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    d2t, t2d = build_vocab_map(counts, 4)
    used = (torch.arange(4) + d2t).tolist()
    assert used == [0, 2, 3, 5]  # the 4 most frequent ids, sorted; ties go to the lower id
    assert t2d.nonzero().flatten().tolist() == used and int(t2d.sum()) == 4
    assert (d2t >= 0).all()  # offsets, not ids: target id = i + d2t[i]
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=[1, 2, 3]), make_tiny_llama(8, layers=4).config, 4
    )
    draft.set_vocab_map(d2t, t2d)
    assert draft.to_target_ids(torch.arange(4)).tolist() == used
    assert default_feature_layers(32) == [2, 16, 29]


def test_head_init_from_target_gives_the_targets_logits_on_the_draft_vocabulary(llama):
    draft = eagle3(llama, vd=12)
    counts = torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(3))
    draft.set_vocab_map(*build_vocab_map(counts, 12))
    with torch.no_grad():  # a non-trivial final norm, so that copying it is checked too
        llama.model.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    draft.init_head_from_target(llama.get_output_embeddings().weight, llama.model.norm)
    h = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(5))
    expected = llama.lm_head(llama.model.norm(h))[..., draft.to_target_ids(torch.arange(12))]
    torch.testing.assert_close(draft.logits(h), expected)
    assert draft.lm_head_d.weight.data_ptr() != llama.lm_head.weight.data_ptr()  # a trainable copy


def test_soft_cross_entropy_is_forward_kl_plus_entropy_in_float64():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6, 9, dtype=torch.float64), -1)
    logits = torch.randn(6, 9, dtype=torch.float64)
    q = torch.softmax(logits, -1)
    kl_pq = (p * (p.log() - q.log())).sum(-1)  # KL(p || q): target first
    kl_qp = (q * (q.log() - p.log())).sum(-1)
    entropy = -(p * p.log()).sum(-1)
    ce = soft_cross_entropy(p, logits).double()
    torch.testing.assert_close(ce - entropy, kl_pq, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(ce - entropy, kl_qp, atol=1e-3)
    # F.kl_div takes (log q, p) and returns KL(p || q): the argument order that is easy to get backwards
    torch.testing.assert_close(F.kl_div(q.log(), p, reduction="none").sum(-1), kl_pq)


def test_eagle1_loss_equals_the_reference_pseudocode():
    torch.manual_seed(0)
    B, H = 2, 8
    f = torch.randn(B, T, H)
    f_hat = torch.randn(B, T, H)
    head = torch.nn.Linear(H, V, bias=False)
    m = torch.rand(B, T) > 0.3
    sums, counts, _ = eagle1_loss(f_hat, f, head(f_hat), head(f), m)
    # ALGORITHMS.md 13 (noise off): column t regresses f_{t+1}; the mask's last column is dropped
    f_tgt = torch.cat([f[:, 1:], torch.zeros_like(f[:, :1])], 1)
    mm = m.clone().float()
    mm[:, -1] = 0
    p = torch.softmax(head(f_tgt), -1)
    logq = torch.log_softmax(head(f_hat), -1)
    L_cls = -(mm[..., None] * p * logq).sum() / mm.sum()
    L_reg = (mm[..., None] * F.smooth_l1_loss(f_hat, f_tgt, reduction="none")).mean(-1).sum() / mm.sum()
    torch.testing.assert_close(sums[0] / counts[0], L_reg)
    torch.testing.assert_close(sums[1] / counts[1], L_cls)


def test_eagle3_step_loss_equals_the_reference_pseudocode():
    torch.manual_seed(0)
    B, Vd = 2, 5
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V)[:Vd]] = True
    tgt = torch.randn(B, T, V)
    tgt[0, 1, t2d.nonzero()[0]] = 20.0  # an in-vocabulary argmax at one position, the rest mostly out
    logits_d = torch.randn(B, T, Vd)
    mask = torch.rand(B, T) > 0.3
    loss, count, _, _ = eagle3_step_loss(logits_d, tgt, mask, t2d)
    # ALGORITHMS.md 13: -(pm * p * log q).sum(-1).mean() over all B*T positions, pm = mask * t2d[argmax]
    keep = t2d[tgt.argmax(-1)][..., None].float()
    pm = mask[..., None].float() * keep
    p = F.softmax(tgt[..., t2d], -1)
    ref = -(pm * p * F.log_softmax(logits_d, -1)).sum(-1).mean()
    torch.testing.assert_close(loss / (B * T), ref)  # our sum; the loop normalises by trained tokens
    assert count == mask.sum()


def test_eagle3_step_alpha_is_the_overlap_over_kept_positions():
    """alpha = sum_v min(p, q) over the draft vocabulary (p renormalised there), summed over the kept trained
    positions: checked in float64 against the definition, and 0 for positions whose argmax is dropped."""
    g = torch.Generator().manual_seed(3)
    B, Vd = 3, 7
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V, generator=g)[:Vd]] = True
    tgt = torch.randn(B, T, V, generator=g)
    tgt[:, ::2][..., t2d.nonzero()[0]] = 12.0  # in-vocabulary argmax on even columns, mostly out elsewhere
    logits_d = torch.randn(B, T, Vd, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    alpha = eagle3_step_loss(logits_d, tgt, mask, t2d)[3]
    p = torch.softmax(tgt[..., t2d].double(), -1)
    q = torch.softmax(logits_d.double(), -1)
    kept = mask & t2d[tgt.argmax(-1)]
    want = (torch.minimum(p, q).sum(-1) * kept).sum()
    torch.testing.assert_close(alpha.double(), want, rtol=1e-5, atol=1e-6)
    assert 0 < float(alpha) < float(kept.sum())
    perfect = eagle3_step_loss(tgt[..., t2d], tgt, mask, t2d)[3]  # q = p: every kept position overlaps fully
    torch.testing.assert_close(perfect, kept.sum().float())


def test_draft_vocabulary_zero_means_the_targets_full_vocabulary():
    assert resolve_draft_vocab(0, 49152) == 49152  # 0: the full vocabulary, no d2t map
    assert resolve_draft_vocab(32000, 49152) == 32000
    assert resolve_draft_vocab(65536, 49152) == 49152  # never more than the target has


@torch.no_grad()
def test_layer_init_from_target_is_the_targets_last_layer_on_the_hidden_half():
    """`draft.layer_init: target`: with the embedding half of q/k/v set to zero, the draft layer computes the
    target's last decoder layer on the hidden state (its input norm as norm_hidden), checked against the
    target's own forward pass; a target layer of other shapes is refused."""
    llama = make_tiny_llama(V, layers=4, hidden=32, seed=7)
    g = torch.Generator().manual_seed(8)
    for layer in llama.model.layers:  # non-trivial norms, so that copying them is checked too
        layer.input_layernorm.weight.uniform_(0.5, 1.5, generator=g)
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5, generator=g)
    draft = eagle3(llama)
    draft.init_layer_from_target(llama.model.layers[-1])
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(draft.layer.self_attn, name).weight[:, :32] = 0
    ids = torch.randint(0, V, (1, T), generator=g)
    states = llama(
        ids, output_hidden_states=True
    ).hidden_states  # input of each layer, then the normed output
    h = states[-2]
    u = torch.cat([draft.norm_in(torch.randn(1, T, 32, generator=g)), draft.norm_hidden(h)], dim=-1)
    out = draft.layer(h, u, torch.arange(T)[None], causal_mask(T))
    torch.testing.assert_close(llama.model.norm(out), states[-1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no self_attn.o_proj of the draft layer's shape"):
        eagle3(llama).init_layer_from_target(make_tiny_llama(V, layers=1, hidden=64).model.layers[0])


def test_num_layers_is_eagle3s_and_at_least_one(llama):
    with pytest.raises(ValueError, match="num_layers is EAGLE-3's layer count"):
        EagleConfig(version=1, num_layers=2)
    with pytest.raises(ValueError, match=r"num_layers is EAGLE-3's layer count \(>= 1\), got 0"):
        EagleConfig(version=3, num_layers=0)
    one, two = eagle3(llama), eagle3(llama, layers=2)
    assert len(one.later) == 0 and not any(n.startswith("later.") for n in one.state_dict())
    # the one-layer drafter's tensors and seeded start are unchanged by the option; the second layer reads H
    shared = {n: p for n, p in two.state_dict().items() if not n.startswith("later.")}
    assert shared.keys() == one.state_dict().keys()
    assert torch.equal(shared["fc.weight"], one.state_dict()["fc.weight"])
    attn = two.later[0].self_attn
    assert isinstance(attn, torch.nn.Module) and isinstance(attn.q_proj, torch.nn.Linear)
    assert attn.q_proj.in_features == 32 and attn.layer_idx == 1
