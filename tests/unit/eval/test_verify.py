"""Verification rules (ALGORITHMS.md section 9) against hand-computed cases and the target distribution."""

from __future__ import annotations

import pytest
import torch
from _chi2 import chi_square_pvalue

from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import DraftTree
from draftsmith.eval.verify import TYPICAL_DELTA, TYPICAL_EPSILON, verify

V = 6


def one_hot_logits(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), V)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_chain_stops_at_first_mismatch_and_appends_target_argmax():
    tree = DraftTree(torch.tensor([9, 1, 2, 3]), [-1, 0, 1, 2])
    # target argmax after root = 1 (match), after node1 = 2 (match), after node2 = 4 (draft said 3)
    verdict = verify(tree, one_hot_logits([1, 2, 4, 0]), Sampling())
    assert verdict.path == [0, 1, 2] and verdict.token == 4


def test_greedy_chain_all_accepted_gives_bonus_from_last_node():
    tree = DraftTree(torch.tensor([9, 1, 2]), [-1, 0, 1])
    verdict = verify(tree, one_hot_logits([1, 2, 5]), Sampling())
    assert verdict.path == [0, 1, 2] and verdict.token == 5


def test_greedy_tree_follows_the_matching_branch():
    # root -> {1: 3, 2: 4}; 1 -> {3: 5}; 2 -> {4: 0, 5: 1}. Target: after root 4, after node 2 1, after node 5 2.
    tree = DraftTree(torch.tensor([9, 3, 4, 5, 0, 1]), [-1, 0, 0, 1, 2, 2])
    verdict = verify(tree, one_hot_logits([4, 0, 1, 0, 0, 2]), Sampling())
    assert verdict.path == [0, 2, 5] and verdict.token == 2


def first_token_counts(tree_fn, p_logits: torch.Tensor, n: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """Counts of the first committed token over `n` verifications, and how often depth 1 was accepted."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    accepted = 0
    sampling = Sampling(temperature=1.0)
    for _ in range(n):
        tree = tree_fn(g)
        logits = p_logits.expand(len(tree), V)
        verdict = verify(tree, logits, sampling, g)
        tok = int(tree.tokens[verdict.path[1]]) if verdict.accepted else verdict.token
        counts[tok] += 1
        accepted += verdict.accepted > 0
    return counts, accepted


P_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
Q_LOGITS = torch.tensor([-1.0, 0.0, 2.0, 1.5, 0.5, 0.0])  # a poor drafter: mass on the wrong tokens
P, Q = torch.softmax(P_LOGITS, -1), torch.softmax(Q_LOGITS, -1)
N = 6000


def sampled_chain(g: torch.Generator) -> DraftTree:
    x = int(torch.multinomial(Q, 1, generator=g))
    return DraftTree(torch.tensor([0, x]), [-1, 0], [Q, None])


def test_chain_rule_reproduces_p_and_accepts_at_one_minus_tvd():
    counts, accepted = first_token_counts(sampled_chain, P_LOGITS, N)
    assert chi_square_pvalue(counts, P) > 1e-3
    expected_accept = float(torch.minimum(P, Q).sum())  # alpha = 1 - TVD(p, q)
    assert abs(accepted / N - expected_accept) < 4 * (expected_accept * (1 - expected_accept) / N) ** 0.5


def test_specinfer_with_iid_sampled_children_reproduces_p():
    def tree(g):
        xs = torch.multinomial(Q, 3, replacement=True, generator=g).tolist()
        return DraftTree(torch.tensor([0, *xs]), [-1, 0, 0, 0], [Q, None, None, None])

    counts, _ = first_token_counts(tree, P_LOGITS, N)
    assert chi_square_pvalue(counts, P) > 1e-3


TOP3 = Q.topk(3).indices.tolist()


def test_point_mass_rule_on_deterministic_top_k_reproduces_p():
    counts, _ = first_token_counts(lambda g: DraftTree(torch.tensor([0, *TOP3]), [-1, 0, 0, 0]), P_LOGITS, N)
    assert chi_square_pvalue(counts, P) > 1e-3


def test_specinfer_rule_on_deterministic_top_k_is_detectably_biased():
    """The negative control: the test above can fail. Treating deterministic top-k children as samples from
    q (ALGORITHMS.md section 12, check 3) skews the output, and the same statistic catches it."""
    counts, _ = first_token_counts(
        lambda g: DraftTree(torch.tensor([0, *TOP3]), [-1, 0, 0, 0], [Q, None, None, None]), P_LOGITS, N
    )
    assert chi_square_pvalue(counts, P) < 1e-6


def test_accepted_child_then_second_token_follows_p_at_that_child():
    """Depth 2: given the depth-1 token was accepted, the next committed token is distributed as p there."""
    p2_logits = torch.tensor([-2.0, 0.0, 1.0, 2.0, 0.0, -1.0])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(V)
    sampling = Sampling(temperature=1.0)
    logits = torch.stack([P_LOGITS, p2_logits, P_LOGITS])
    for _ in range(N):
        tree = DraftTree(torch.tensor([0, 0, 1]), [-1, 0, 1])  # deterministic chain 0 -> 1
        verdict = verify(tree, logits, sampling, g)
        if verdict.accepted >= 1:
            nxt = int(tree.tokens[2]) if verdict.accepted == 2 else verdict.token
            counts[nxt] += 1
    assert chi_square_pvalue(counts, torch.softmax(p2_logits, -1)) > 1e-3


def test_top_p_applies_to_the_target_distribution():
    sampling = Sampling(temperature=1.0, top_p=0.6)
    probs = sampling.probs(P_LOGITS[None])[0]
    assert probs[2:].sum() == 0  # softmax(P) = [.57, .21, ...]: tokens 0 and 1 make the 0.6 nucleus
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        verdict = verify(DraftTree(torch.tensor([0, 4]), [-1, 0]), P_LOGITS[None].expand(2, V), sampling, g)
        assert verdict.accepted == 0 and verdict.token in (0, 1)


def test_typical_acceptance_threshold_and_longest_path():
    # Root distribution: confident (low entropy) -> threshold = min(eps, delta * exp(-H)).
    root = torch.tensor([3.0, 2.0, -2.0, -2.0, -2.0, -2.0])
    probs = torch.softmax(root, -1)
    entropy = -(probs * torch.log(probs + 1e-5)).sum()
    threshold = min(TYPICAL_EPSILON, TYPICAL_DELTA * float(torch.exp(-entropy)))
    assert float(probs[1]) > threshold > float(probs[2])  # token 1 passes, token 2 does not
    flat = torch.zeros(V)  # uniform: threshold = min(0.09, 0.3/6) = 0.05 < 1/6: every token passes
    # root -> {1: token 1, 2: token 2}; node 1 -> {3: token 5}
    tree = DraftTree(torch.tensor([9, 1, 2, 5]), [-1, 0, 0, 1])
    verdict = verify(tree, torch.stack([root, flat, flat, flat]), Sampling(), acceptance="typical")
    assert verdict.path == [0, 1, 3]
    assert verdict.token == 0  # greedy: argmax of the last accepted node's logits (uniform -> first)


def test_typical_acceptance_accepts_at_least_what_greedy_accepts():
    """Invariant: the target's argmax always passes the typical threshold (e^-H <= max p, so
    0.3 e^-H < max p), hence on any tree the typical path is at least as long as the greedy one."""
    g = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7]
    longer = 0
    for _ in range(300):
        logits = torch.randn(len(parents), V, generator=g) * 3
        tree = DraftTree(torch.randint(0, V, (len(parents),), generator=g), parents)
        greedy = verify(tree, logits, Sampling())
        typical = verify(tree, logits, Sampling(), acceptance="typical")
        assert typical.accepted >= greedy.accepted
        longer += typical.accepted > greedy.accepted
    assert longer > 0  # and it is lossy: it accepts non-argmax tokens too


def test_unknown_acceptance_rule_is_an_error():
    with pytest.raises(ValueError, match="exact"):
        verify(DraftTree(torch.tensor([0]), [-1]), torch.zeros(1, V), Sampling(), acceptance="fast")
