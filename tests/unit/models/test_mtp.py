"""MTP modules: who predicts what (ALGORITHMS.md 1.3 / 7.1), causality, the drafter, the checkpoint."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama

from draftsmith.eval.drafters import MTPDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.checkpoint import load_drafter, save_drafter
from draftsmith.models.mtp import MTPConfig, MTPDraft, shift_tokens
from draftsmith.train.mtp import depth_masks

V, H = 48, 32


def mtp(llama, modules: int = 3) -> MTPDraft:
    torch.manual_seed(0)
    draft = MTPDraft(MTPConfig(num_modules=modules), llama.config, V).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    return draft


def test_module_k_predicts_t_plus_k_plus_1_on_a_hand_built_sequence():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])  # answer tokens t2..t6
    batch = {"input_ids": ids, "loss_mask": loss_mask}
    # module 1 reads t_{i+1}, predicts t_{i+2}; module 2 reads t_{i+2}, predicts t_{i+3}
    assert shift_tokens(ids, 1).tolist() == [[11, 12, 13, 14, 15, 16, 0]]
    assert shift_tokens(ids, 2).tolist() == [[12, 13, 14, 15, 16, 0, 0]]  # module 1's labels
    assert shift_tokens(ids, 3).tolist() == [[13, 14, 15, 16, 0, 0, 0]]  # module 2's labels
    m1, m2 = depth_masks(batch, 2)
    assert m1.tolist() == [[True, True, True, True, True, False, False]]  # labels t2..t6 are answers
    assert m2.tolist() == [[True, True, True, True, False, False, False]]  # labels t3..t6


def test_column_i_of_module_k_sees_exactly_h_up_to_i_and_tokens_up_to_i_plus_k():
    """Perturbation oracle: change one input and see which logits move."""
    llama = make_tiny_llama(V, layers=2, hidden=H)
    draft = mtp(llama)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (1, 10), generator=g)
    feats = torch.randn(1, 10, H, generator=g)
    base = draft(feats, ids)
    i = 4
    for k in (1, 2, 3):
        for j, should_move in ((i + k, True), (i + k + 1, False)):
            other = ids.clone()
            other[0, j] = (other[0, j] + 1) % V
            moved = not torch.allclose(draft(feats, other)[k - 1][0, i], base[k - 1][0, i])
            assert moved == should_move, (k, j)
        f = feats.clone()
        f[0, i + 1] += 1.0  # a later feature never reaches column i
        assert torch.allclose(draft(f, ids)[k - 1][0, i], base[k - 1][0, i])
        f = feats.clone()
        f[0, i] += 1.0
        assert not torch.allclose(draft(f, ids)[k - 1][0, i], base[k - 1][0, i])


def test_drafter_chain_equals_the_teacher_forced_forward_on_context_plus_drafts(tiny_random_target):
    """Oracle: draft k = argmax of module k at the last context column when the training forward is fed the
    context followed by the drafts (what the drafter claims to compute, without a cache)."""
    target = tiny_random_target
    draft = MTPDraft(MTPConfig(num_modules=3), target.model.config, target.vocab_size).eval()
    draft.attach_target(target.embed_tokens, target.head)
    drafter = MTPDrafter(draft)
    context = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    L = target.num_layers
    feats, _ = target.forward(torch.tensor([context]), layer_ids=(L,))
    drafter.start()
    drafter.observe({L: feats[L][0, :-1]})  # features of columns 0..n-1 pair with context[1..n]
    tree = drafter.propose(context, parse_tree("chain", 3), Sampling(), None)
    drafts = tree.tokens[1:].tolist()
    full = torch.tensor([context + drafts])
    padded = torch.cat([feats[L], torch.zeros(1, 3, feats[L].shape[-1])], dim=1)
    logits = draft(padded, full)
    n = len(context) - 1
    assert drafts == [int(logits[k][0, n - 1].argmax()) for k in range(3)]
    assert tree.parents == [-1, 0, 1, 2]


def test_checkpoint_round_trip_gives_identical_logits(tiny_random_target, tmp_path):
    target = tiny_random_target
    draft = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size).eval()
    draft.attach_target(target.embed_tokens, target.head)
    save_drafter(tmp_path / "ckpt", draft, target.identity())
    loaded, config = load_drafter(tmp_path / "ckpt", target)
    assert config["kind"] == "mtp" and config["feature_layers"] == [target.num_layers]
    assert not any(k.startswith(("embed", "lm_head")) for k in loaded.state_dict())  # shared, never saved
    ids = torch.randint(0, target.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    feats = torch.randn(2, 6, target.hidden_size)
    for a, b in zip(draft(feats, ids), loaded(feats, ids), strict=True):
        torch.testing.assert_close(a, b)


def test_nextn_export_layout_round_trips_and_refuses_a_foreign_embedding(tiny_random_target):
    import pytest

    from draftsmith.models.mtp import load_nextn_state_dict, nextn_state_dict

    target = tiny_random_target
    L = target.num_layers
    draft = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size).eval()
    draft.attach_target(target.embed_tokens, target.head)
    state = nextn_state_dict(draft)
    second = {
        k.removeprefix(f"model.layers.{L + 1}.") for k in state if k.startswith(f"model.layers.{L + 1}.")
    }
    assert {
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "shared_head.norm.weight",
        "shared_head.head.weight",
        "embed_tokens.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "mlp.down_proj.weight",
    } <= second
    assert state[f"model.layers.{L}.eh_proj.weight"].shape == (target.hidden_size, 2 * target.hidden_size)
    fresh = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size).eval()
    fresh.attach_target(target.embed_tokens, target.head)
    load_nextn_state_dict(fresh, state)
    ids = torch.randint(0, target.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    feats = torch.randn(1, 5, target.hidden_size)
    for a, b in zip(draft(feats, ids), fresh(feats, ids), strict=True):
        torch.testing.assert_close(a, b)
    bad = dict(state)
    bad[f"model.layers.{L}.embed_tokens.weight"] = torch.randn_like(
        bad[f"model.layers.{L}.embed_tokens.weight"]
    )
    with pytest.raises(ValueError, match="not the target's embed_tokens"):
        load_nextn_state_dict(fresh, bad)
    with pytest.raises(ValueError, match="missing"):
        load_nextn_state_dict(fresh, {k: v for k, v in state.items() if "hnorm" not in k})


def test_drafter_tree_children_are_the_ranked_tokens_of_the_forward_along_their_path(tiny_random_target):
    """Oracle for trees: every node's k-th ranked child is the rank-k token of module depth+1 when the training
    forward is fed the context followed by that node's path."""
    target = tiny_random_target
    draft = MTPDraft(MTPConfig(num_modules=3), target.model.config, target.vocab_size).eval()
    draft.attach_target(target.embed_tokens, target.head)
    drafter = MTPDrafter(draft)
    context = torch.randint(0, target.vocab_size, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    L, n = target.num_layers, len(context) - 1
    feats, _ = target.forward(torch.tensor([context]), layer_ids=(L,))
    drafter.start()
    drafter.observe({L: feats[L][0, :-1]})
    shape = parse_tree("topk:2", 3)
    tree = drafter.propose(context, shape, Sampling(), None)
    tokens, parents = tree.tokens.tolist(), tree.parents
    path: dict[int, list[int]] = {0: []}
    for i in range(1, len(parents)):
        path[i] = path[parents[i]] + [tokens[i]]
    padded = torch.cat([feats[L], torch.zeros(1, 3, feats[L].shape[-1])], dim=1)
    for i in range(1, len(parents)):
        node, d = parents[i], len(path[i])
        logits = draft(padded, torch.tensor([context + path[node] + [0] * (3 - len(path[node]))]))
        rank = shape.paths[i - 1][-1]
        assert tokens[i] == int(logits[d - 1][0, n - 1].topk(rank + 1).indices[rank]), (i, path[i])
