"""Tree shapes, ancestor masks and the 4D tree-attention mask."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.eval.tree import DraftTree, parse_tree, tree_attention


def test_chain_and_topk_shapes():
    assert parse_tree("chain", 3).paths == ((0,), (0, 0), (0, 0, 0))
    topk = parse_tree("topk:2", 2)
    assert topk.paths == ((0,), (1,), (0, 0), (0, 1))
    assert topk.parents() == [-1, 0, 0, 1, 1] and not topk.sampled and not topk.is_chain
    assert parse_tree("sample:2", 2).sampled


def test_paths_file_is_sorted_truncated_and_must_be_prefix_closed(tmp_path):
    f = tmp_path / "tree.json"
    f.write_text(json.dumps([[0, 1], [1], [0], [0, 0], [0, 0, 0]]))
    shape = parse_tree(f"paths:{f}", 2)
    assert shape.paths == ((0,), (1,), (0, 0), (0, 1))
    f.write_text(json.dumps([[0], [1, 0]]))
    with pytest.raises(ValueError, match=r"\[1\]"):
        parse_tree(f"paths:{f}", 5)
    with pytest.raises(ValueError, match="chain, topk:K"):
        parse_tree("beam:3", 5)
    with pytest.raises(ValueError, match="K >= 1"):
        parse_tree("topk:0", 5)


def test_ancestor_mask_and_attention_mask_match_a_brute_force_walk():
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tree = DraftTree(torch.arange(7), parents)
    anc = tree.ancestor_mask()
    for i in range(7):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = parents[j]
        assert {j for j in range(7) if anc[i, j]} == chain
    mask = tree_attention(anc, past_len=3, dtype=torch.float32, device=torch.device("cpu"))
    assert mask.shape == (1, 1, 7, 10)
    assert (mask[0, 0, :, :3] == 0).all()  # the whole prefix is visible
    assert torch.equal(mask[0, 0, :, 3:] == 0, anc)
    assert tree.depths() == [0, 1, 1, 2, 2, 2, 3] and tree.path_to(6) == [0, 1, 3, 6]


def test_depth_and_tree_size_are_bounded_with_the_range_in_the_message():
    """`--depth 100000` with a chain, or a tree of more nodes than one forward verifies, fails at parse time
    (it used to grow until the kernel killed the process)."""
    import pytest

    from draftsmith.eval.tree import MAX_DEPTH, MAX_TREE_NODES, parse_tree

    assert len(parse_tree("chain", MAX_DEPTH).paths) == MAX_DEPTH
    with pytest.raises(ValueError, match=rf"--depth must be in 0..{MAX_DEPTH}.*got 100000"):
        parse_tree("chain", 100000)
    with pytest.raises(ValueError, match=rf"drafts 1280 tokens per step; at most {MAX_TREE_NODES}"):
        parse_tree("topk:20", 64)
    with pytest.raises(ValueError, match=rf"drafts 5000 tokens per step; at most {MAX_TREE_NODES}"):
        parse_tree("dynamic:4:5000", 8)
    assert len(parse_tree("topk:16", 64).paths) == MAX_TREE_NODES
