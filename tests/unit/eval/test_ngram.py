"""Prompt-lookup drafting on hand-made contexts."""

from __future__ import annotations

import pytest

from draftsmith.eval.drafters import NgramDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree


def test_latest_longest_match_continuation():
    d = NgramDrafter(max_ngram=2, min_ngram=1)
    ctx = [1, 2, 3, 4, 9, 1, 2, 5, 6, 7, 1, 2]
    # bigram (1, 2) occurs at 0 and 5 (and is the tail at 10): the latest earlier one is at 5 -> 5 6 7
    assert d.continuations(ctx, 3, 1) == [[5, 6, 7]]
    assert d.continuations(ctx, 3, 2) == [[5, 6, 7], [3, 4, 9]]
    assert d.continuations([1, 2, 3], 3, 1) == []  # no earlier occurrence of any suffix n-gram


def test_topk_tree_is_a_trie_of_continuations():
    d = NgramDrafter(max_ngram=1, min_ngram=1)
    ctx = [4, 5, 6, 4, 5, 7, 4]  # after 4: "5 7" (latest) and "5 6": shared first token
    tree = d.propose(ctx, parse_tree("topk:2", 2), Sampling(), None)
    assert tree.tokens.tolist() == [4, 5, 7, 6] and tree.parents == [-1, 0, 1, 1]
    with pytest.raises(ValueError, match="deterministic"):
        d.propose(ctx, parse_tree("sample:2", 2), Sampling(temperature=1.0), None)


def test_earliest_match_is_vllms_rule_after_the_longest_ngram():
    d = NgramDrafter(max_ngram=2, min_ngram=1, match="earliest")
    ctx = [1, 2, 3, 4, 9, 1, 2, 5, 6, 7, 1, 2]
    assert d.continuations(ctx, 3, 1) == [[3, 4, 9]]  # (1, 2) at 0 and 5: the earliest, at 0
    longest = [1, 2, 8, 5, 1, 2, 9, 5, 1, 2]  # (5, 1, 2) occurs once before the tail, (1, 2) three times
    for match in ("latest", "earliest"):
        assert NgramDrafter(3, 1, match).continuations(longest, 3, 1) == [[9, 5, 1]]
    with pytest.raises(ValueError, match="'latest' or 'earliest'"):
        NgramDrafter(3, 1, "first")
