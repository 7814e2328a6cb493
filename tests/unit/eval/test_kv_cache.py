"""After a tree forward and compaction, the target's cache equals the cache of the committed sequence."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama
from transformers import DynamicCache

from draftsmith.eval.kv_cache import keep_path
from draftsmith.eval.tree import DraftTree, tree_attention
from draftsmith.models.parts import with_cache


@torch.no_grad()
def test_tree_forward_matches_sequential_and_compacted_cache_continues_exactly():
    model = make_tiny_llama(64, layers=2)
    prefix = torch.randint(0, 64, (1, 7))
    tree = DraftTree(torch.tensor([5, 11, 12, 13, 14, 15]), [-1, 0, 0, 2, 2, 4])
    cache = DynamicCache(config=model.config)
    model(prefix, **with_cache(model, cache), use_cache=True)
    past = prefix.shape[1]
    depth = torch.tensor(tree.depths())
    mask = tree_attention(tree.ancestor_mask(), past, torch.float32, torch.device("cpu"))
    tree_logits = model(
        tree.tokens[None], attention_mask=mask, position_ids=(past + depth)[None], **with_cache(model, cache)
    ).logits[0]
    # Oracle 1: each node's logits equal a plain causal forward over prefix + its root-to-node path.
    for node in range(len(tree)):
        path = tree.tokens[tree.path_to(node)]
        ref = model(torch.cat([prefix[0], path])[None]).logits[0, -1]
        torch.testing.assert_close(tree_logits[node], ref, atol=1e-5, rtol=1e-5)
    # Oracle 2: after keeping the scattered path 0 -> 2 -> 4, the next token's logits equal a fresh forward.
    kept = [0, 2, 4]
    keep_path(cache, past, kept)
    assert cache.get_seq_length() == past + 3
    nxt = torch.tensor([[7]])
    got = model(nxt, **with_cache(model, cache)).logits[0, -1]
    ref = model(torch.cat([prefix[0], tree.tokens[kept], nxt[0]])[None]).logits[0, -1]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_contiguous_path_is_a_crop():
    model = make_tiny_llama(64, layers=1)
    cache = DynamicCache(config=model.config)
    model(torch.randint(0, 64, (1, 9)), **with_cache(model, cache), use_cache=True)
    keep_path(cache, 4, [0, 1, 2])
    assert cache.get_seq_length() == 7


@torch.no_grad()
def test_fp8_cache_keeps_what_feeding_only_the_path_would_have_stored():
    """An fp8 cache (scale frozen at the prefill) after a tree forward and `keep_path` / `crop_to` holds
    bit-for-bit the fp8 keys and values, and length, of a cache fed the prefix then only the kept tokens at
    their positions; the next forward's logits are equal too."""
    from draftsmith.eval.kv_cache import crop_to, new_cache, seq_length

    model = make_tiny_llama(64, layers=2)
    prefix = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(3))
    tree = DraftTree(torch.tensor([5, 11, 12, 13, 14, 15]), [-1, 0, 0, 2, 2, 4])
    past, path = prefix.shape[1], [0, 2, 4]
    cache = new_cache(model.config, "fp8")
    model(prefix, **with_cache(model, cache), use_cache=True)
    depth = torch.tensor(tree.depths())
    mask = tree_attention(tree.ancestor_mask(), past, torch.float32, torch.device("cpu"))
    model(
        tree.tokens[None], attention_mask=mask, position_ids=(past + depth)[None], **with_cache(model, cache)
    )
    keep_path(cache, past, path)

    oracle = new_cache(model.config, "fp8")
    model(prefix, **with_cache(model, oracle), use_cache=True)
    for i, node in enumerate(path):  # one token at a time, as plain decoding feeds them
        model(
            tree.tokens[node][None, None],
            position_ids=torch.tensor([[past + i]]),
            **with_cache(model, oracle),
        )
    assert seq_length(cache) == cache.get_seq_length() == past + len(path)
    for got, want in zip(cache.layers, oracle.layers, strict=True):
        assert got._quantized_keys[0].dtype == torch.float8_e4m3fn
        for a, b in (
            (got._quantized_keys, want._quantized_keys),
            (got._quantized_values, want._quantized_values),
        ):
            assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
    nxt = torch.tensor([[7]])
    assert torch.equal(
        model(nxt, **with_cache(model, cache)).logits, model(nxt, **with_cache(model, oracle)).logits
    )
    crop_to(cache, past + 1)
    assert cache.get_seq_length() == past + 1 and cache.layers[0]._quantized_keys[0].shape[-2] == past + 1


def test_fp8_cache_is_refused_for_linear_attention_targets():
    import pytest
    from transformers import Qwen3NextConfig

    from draftsmith.eval.kv_cache import new_cache

    config = Qwen3NextConfig(
        num_hidden_layers=4,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=64,
    )
    with pytest.raises(ValueError, match="linear-attention layers: use --kv-cache auto"):
        new_cache(config, "fp8")


@torch.no_grad()
def test_restoring_a_linear_attention_snapshot_continues_as_a_cache_fed_only_the_kept_tokens():
    """Qwen3-Next's hybrid cache: snapshot, feed a rejected chain, restore, feed the accepted part. The
    cache's length and the next logits (positions taken from the cache, as `generate` does) equal those of
    a cache fed the prefix then only the kept tokens. transformers >= 5.25 also counts a linear layer's
    tokens (`cumulative_length_linear`); a restore that leaves the count behind shifts every position."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from draftsmith.eval.kv_cache import new_cache, restore, snapshot

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        vocab_size=64,
    )
    model = Qwen3NextForCausalLM(config).eval()
    prefix, chain, kept = torch.randint(0, 64, (1, 9)), torch.tensor([[5, 11, 12, 13]]), 2
    cache = new_cache(config)
    model(prefix, **with_cache(model, cache), use_cache=True)
    before = snapshot(cache)
    model(chain, **with_cache(model, cache), use_cache=True)
    restore(cache, before)
    model(chain[:, :kept], **with_cache(model, cache), use_cache=True)

    oracle = new_cache(config)
    model(torch.cat([prefix, chain[:, :kept]], dim=1), **with_cache(model, oracle), use_cache=True)
    assert int(cache.get_seq_length()) == int(oracle.get_seq_length()) == prefix.shape[1] + kept
    nxt = torch.tensor([[7]])
    torch.testing.assert_close(
        model(nxt, **with_cache(model, cache)).logits, model(nxt, **with_cache(model, oracle)).logits
    )
