"""`draft.copy_attention`: a loss on the attention of the fused layer's kv group 0, toward the earlier columns
whose continuation is the label. The sources against a brute-force scan, the scores against transformers' own
eager attention, the loss against an explicit softmax, and a few steps of training that teach the head to find
a repeated block's earlier occurrence."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import torch
from conftest import make_tiny_llama
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget
from draftsmith.train.eagle import EagleMethod, _Eagle3Train
from draftsmith.train.prompt_lookup import COPY_TERM, copy_attention_terms, copy_columns


def brute_sources(ids: list[int], length: int) -> set[tuple[int, int]]:
    """(t, j) with j <= t, ids[j] == ids[t+1] and ids[j+1] == ids[t+2], t + 2 < length."""
    return {
        (t, j)
        for t in range(length - 2)
        for j in range(t + 1)
        if ids[j] == ids[t + 1] and ids[j + 1] == ids[t + 2]
    }


def test_copy_columns_by_hand_and_against_a_scan() -> None:
    ids = torch.tensor([[5, 7, 9, 5, 7, 9, 5, 7]])
    found = {(t, j) for t, j in copy_columns(ids, torch.ones_like(ids))[0].nonzero().tolist()}
    # t=2 (x3=5, x4=7) reads j=0; t=3 (7, 9) j=1; t=4 (9, 5) j=2; t=5 (5, 7) j=0 and 3; t=6 has no x8
    assert found == {(2, 0), (3, 1), (4, 2), (5, 0), (5, 3)}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 3, (4, 12), generator=gen)
    lengths = [12, 9, 5, 2]
    attention = (torch.arange(12)[None] < torch.tensor(lengths)[:, None]).long()
    got = copy_columns(ids, attention)
    for b, length in enumerate(lengths):
        assert {(t, j) for t, j in got[b].nonzero().tolist()} == brute_sources(ids[b].tolist(), length)


def _draft(layer: Literal["llama", "qwen3"] = "llama") -> _Eagle3Train:
    llama = make_tiny_llama(13, layers=4, hidden=32)
    target = FrozenTarget(llama, SimpleNamespace(pad_token_id=0), "tiny-13")
    torch.manual_seed(0)
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=2, labels="data", layer=layer)
    draft = _Eagle3Train(cfg, target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    return draft


@pytest.mark.parametrize("step", [0, 2])
@pytest.mark.parametrize("layer", ["llama", "qwen3"])
def test_group_scores_are_the_layer_s_own_attention(layer: Literal["llama", "qwen3"], step: int) -> None:
    """Oracle: transformers' eager attention over the layer's full projections (all heads, its own q/k norms
    and rotary embedding); group 0's heads are the first `group` of them. At a later TTT step the queries come
    from that step's input at positions t + step, the keys from step 0's."""
    draft = _draft(layer)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 13, (2, 9), generator=gen)
    hidden = torch.randn(2, 9, 32, generator=gen)
    later_ids = torch.randint(0, 13, (2, 9), generator=gen) if step else ids
    later = torch.randn(2, 9, 32, generator=gen) if step else hidden
    scores = draft.group_scores(hidden, ids, query=(later, later_ids, step) if step else None)
    attn: Any = draft.layer.self_attn
    u = draft.attention_input(hidden, draft._parts().embed_tokens(ids))
    u_later = draft.attention_input(later, draft._parts().embed_tokens(later_ids))
    hd, group = attn.head_dim, attn.num_key_value_groups
    q = attn.q_proj(u_later).view(2, 9, -1, hd)
    k = attn.k_proj(u).view(2, 9, -1, hd)
    if layer == "qwen3":
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = draft.layer.rotary_emb(hidden, torch.arange(9)[None])
    q_cos, q_sin = draft.layer.rotary_emb(hidden, torch.arange(9)[None] + step)
    q = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), q_cos, q_sin)[0]
    k = apply_rotary_pos_emb(k.transpose(1, 2), k.transpose(1, 2), cos, sin)[0]
    v = torch.zeros_like(k)
    causal = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    _, weights = eager_attention_forward(attn, q, k, v, causal, scaling=attn.scaling)
    mine = scores.masked_fill(causal.isinf(), float("-inf")).softmax(-1)
    assert scores.shape == (2, group, 9, 9)
    assert torch.allclose(mine, weights[:, :group], atol=1e-6)


def test_the_loss_is_minus_log_the_attention_on_the_sources() -> None:
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(1, 2, 4, 4, generator=gen, dtype=torch.float64)
    columns = torch.zeros(1, 4, 4, dtype=torch.bool)
    columns[0, 2, 0] = columns[0, 3, 0] = columns[0, 3, 2] = True
    rows = torch.tensor([[False, False, True, True]])
    keys = torch.tensor([[True, True, True, True]])
    loss, hits = copy_attention_terms(scores, columns, rows, keys)
    expected, peaks = 0.0, 0
    for t in (2, 3):
        probs = scores[0, :, t, : t + 1].softmax(-1)  # [G, t+1]: column t reads columns <= t
        mass = probs[:, columns[0, t, : t + 1]].sum(-1)
        expected += float(-mass.log().mean())
        peaks += bool(columns[0, t, int(probs.mean(0).argmax())])
    assert math.isclose(float(loss), expected, rel_tol=1e-6)  # computed in float32
    assert int(hits) == peaks


def test_the_term_trains_group_0_and_fc_only_and_teaches_the_head_to_copy() -> None:
    """Random tokens with a block repeated: after 60 steps on the copy term alone, group 0's attention peaks on
    the earlier occurrence at most of the repeated columns, where it did at almost none before. Its gradient
    reaches fc, the norms and group 0's query and key rows, and no other head."""
    llama = make_tiny_llama(13, layers=4, hidden=32)
    target = FrozenTarget(llama, SimpleNamespace(pad_token_id=0), "tiny-13")
    torch.manual_seed(0)
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=2, labels="data", copy_attention=1.0)
    draft = _Eagle3Train(cfg, target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    method = EagleMethod(target, draft)
    assert method.term_names == ["depth1", "depth2", COPY_TERM]
    assert method.term_weights.tolist() == pytest.approx([1.0, 0.8, 1.0])

    def batch(seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        block = torch.randint(0, 13, (8, 10), generator=gen)
        ids = torch.cat([block, block], 1)
        ones = torch.ones_like(ids)
        return {"input_ids": ids, "attention_mask": ones, "loss_mask": ones.bool()}

    def peaks(seed: int) -> float:
        b = method.prepare_batch(draft, batch(seed), 0, 0, 0)
        with torch.no_grad():
            _, metrics = method.loss_terms(draft.eval(), b)
        return float(metrics["top1"][-1] / method.token_counts(b)[-1])

    before = peaks(100)
    attn: Any = draft.layer.self_attn
    hd = attn.head_dim
    q_rows = attn.num_key_value_groups * hd
    opt = torch.optim.Adam(draft.parameters(), lr=3e-3)
    for step in range(60):
        sums, _ = method.loss_terms(draft.train(), batch(step))
        opt.zero_grad()
        (sums[-1] / method.token_counts(batch(step))[-1]).backward()
        if step == 0:
            q_grad, k_grad, fc_grad = (
                torch.as_tensor(p.grad) for p in (attn.q_proj.weight, attn.k_proj.weight, draft.fc.weight)
            )
            assert q_grad[:q_rows].abs().sum() > 0 and q_grad[q_rows:].abs().sum() == 0
            assert k_grad[:hd].abs().sum() > 0 and k_grad[hd:].abs().sum() == 0
            assert fc_grad.abs().sum() > 0
            assert draft.lm_head_d.weight.grad is None or draft.lm_head_d.weight.grad.abs().sum() == 0
        opt.step()
    after = peaks(100)
    assert before < 0.3 and after > 0.8, (before, after)


def test_copy_attention_is_eagle3_s_and_not_negative() -> None:
    assert EagleConfig().copy_attention == 0.0
    with pytest.raises(ValueError, match="copy-attention loss weight"):
        EagleConfig(version=3, copy_attention=-1.0)
    with pytest.raises(ValueError, match="copy-attention loss weight"):
        EagleConfig(version=1, copy_attention=0.5)


@pytest.mark.parametrize("labels", ["target", "data"])
def test_the_term_leaves_the_depth_terms_as_they_were(labels: Literal["target", "data"]) -> None:
    """The same drafter with and without the term: equal depth sums and metrics, one more term whose sum is
    `copy_attention_terms` of the drafter's own group scores, counted over the columns with a source."""
    llama = make_tiny_llama(13, layers=4, hidden=32)
    target = FrozenTarget(llama, SimpleNamespace(pad_token_id=0), "tiny-13")
    methods = []
    for weight in (0.0, 0.5):
        torch.manual_seed(0)
        cfg = EagleConfig(
            version=3, feature_layers=[1, 2, 3], ttt_steps=3, labels=labels, copy_attention=weight
        )
        draft = _Eagle3Train(cfg, target.model.config, target.vocab_size)
        draft.attach_target(target.embed_tokens, target.head)
        methods.append(EagleMethod(target, draft))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 4, (2, 14), generator=gen)
    attention = torch.ones_like(ids)
    attention[1, 11:] = 0
    loss_mask = attention.bool() & (torch.arange(14) >= 3)
    b = {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    (plain_sums, plain_metrics), (sums, metrics) = (m.loss_terms(m.model.eval(), b) for m in methods)
    assert torch.allclose(sums[:3], plain_sums) and len(sums) == 4
    assert all(torch.allclose(metrics[k][:3], v) for k, v in plain_metrics.items())
    with_term = methods[1]
    assert with_term.term_weights.tolist() == pytest.approx([1.0, 0.8, 0.64, 0.5])
    first_mask = with_term._masks(b)[0]
    columns = copy_columns(ids, attention)
    rows = columns.any(-1) & first_mask
    model: Any = with_term.model
    feats, _ = target.batch_features(b, model.feature_layers)
    g = torch.cat([feats[i] for i in model.feature_layers], -1)
    scores = model.group_scores(model.project(g), shift_left(ids))
    expected, _ = copy_attention_terms(scores, columns, rows, attention.bool())
    assert rows.sum() > 0 and torch.isclose(sums[3], expected)
    assert with_term.token_counts(b)[-1] == rows.sum()
