"""After a tree forward and compaction, the target's cache equals the cache of the committed sequence."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama
from transformers import DynamicCache

from draftsmith.eval.kv_cache import keep_path
from draftsmith.eval.tree import DraftTree, tree_attention


@torch.no_grad()
def test_tree_forward_matches_sequential_and_compacted_cache_continues_exactly():
    model = make_tiny_llama(64, layers=2)
    prefix = torch.randint(0, 64, (1, 7))
    tree = DraftTree(torch.tensor([5, 11, 12, 13, 14, 15]), [-1, 0, 0, 2, 2, 4])
    cache = DynamicCache(config=model.config)
    model(prefix, past_key_values=cache, use_cache=True)
    past = prefix.shape[1]
    depth = torch.tensor(tree.depths())
    mask = tree_attention(tree.ancestor_mask(), past, torch.float32, torch.device("cpu"))
    tree_logits = model(
        tree.tokens[None], attention_mask=mask, position_ids=(past + depth)[None], past_key_values=cache
    ).logits[0]
    # Oracle 1: each node's logits equal a plain causal forward over prefix + its root-to-node path.
    for node in range(len(tree)):
        path = tree.tokens[tree.path_to(node)]
        ref = model(torch.cat([prefix[0], path])[None]).logits[0, -1]
        torch.testing.assert_close(tree_logits[node], ref, atol=1e-5, rtol=1e-5)
    # Oracle 2: after keeping the scattered path 0 -> 2 -> 4, the next token's logits equal a fresh forward.
    path = [0, 2, 4]
    keep_path(cache, past, path)
    assert cache.get_seq_length() == past + 3
    nxt = torch.tensor([[7]])
    got = model(nxt, past_key_values=cache).logits[0, -1]
    ref = model(torch.cat([prefix[0], tree.tokens[path], nxt[0]])[None]).logits[0, -1]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_contiguous_path_is_a_crop():
    model = make_tiny_llama(64, layers=1)
    cache = DynamicCache(config=model.config)
    model(torch.randint(0, 64, (1, 9)), past_key_values=cache, use_cache=True)
    keep_path(cache, 4, [0, 1, 2])
    assert cache.get_seq_length() == 7
