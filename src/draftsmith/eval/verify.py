"""Verification of a draft tree against the target's logits, exactly as ALGORITHMS.md section 9.

`verify` walks the tree from the root. At each accepted node it tries the node's children in order:

- greedy (T = 0, 9.1): accept the child equal to the target's argmax; the committed extra token is the argmax
  at the last accepted node. For a chain this is "longest matching prefix"; for a tree, the first longest
  path, as in the Medusa and EAGLE code.
- sampled children (9.2 / 9.4a, SpecInfer): accept child c w.p. min(1, p'(c) / q(c)), else
  p' <- norm(max(0, p' - q)); the chain rule of Leviathan et al. is the one-child case.
- deterministic children (9.4b, point-mass rule): accept c w.p. p'(c), else p'(c) <- 0 and renormalise.
  Using the drafter's softmax as q here would be biased (ALGORITHMS.md section 12, check 3).
When no child is accepted the extra token is drawn from the adjusted p'; at a leaf it is the bonus token
drawn from p. Both rules are exactly lossless: the committed tokens are distributed as target sampling.

`typical` is Medusa's typical acceptance (9.3): lossy, offered only when asked for explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import Sampling, sample, uniform
from .tree import DraftTree

TYPICAL_EPSILON = 0.09  # Medusa's posterior_threshold, as medusa_generate passes it
TYPICAL_DELTA = 0.3  # Medusa's posterior_alpha


@dataclass
class Verdict:
    """Outcome of one verification: `path` = accepted node indices from the root (root included), and the
    token the target commits after them (correction or bonus)."""

    path: list[int]
    token: int

    @property
    def accepted(self) -> int:
        """Accepted draft tokens (the root is not a draft token)."""
        return len(self.path) - 1


def verify(
    tree: DraftTree,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    acceptance: str = "exact",
) -> Verdict:
    """Verify `tree` given the target's logits `[N, V]` at its nodes (row i = next-token logits after node i)."""
    if acceptance == "typical":
        return _verify_typical(tree, logits, sampling, generator)
    if acceptance != "exact":
        raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
    if sampling.greedy:
        return _verify_greedy(tree, logits)
    return _verify_sampled(tree, sampling.probs(logits), generator)


def _verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    best = logits.argmax(dim=-1).tolist()
    tokens = tree.tokens.tolist()
    children = tree.children()
    path = [0]
    while True:
        node = path[-1]
        nxt = next((c for c in children[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return Verdict(path, best[node])
        path.append(nxt)


def _verify_sampled(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    tokens = tree.tokens.tolist()
    children = tree.children()
    path = [0]
    while True:
        node = path[-1]
        p = probs[node]
        q = tree.q[node]
        accepted = None
        for child in children[node]:
            c = tokens[child]
            if q is not None:  # SpecInfer / Leviathan: the child was drawn from q
                if uniform(generator) < min(1.0, float(p[c]) / max(float(q[c]), 1e-30)):
                    accepted = child
                    break
                p = _normalise(torch.clamp(p - q, min=0), fallback=p)
            else:  # point mass on a deterministic candidate
                if uniform(generator) < float(p[c]):
                    accepted = child
                    break
                p = p.clone()
                p[c] = 0
                p = _normalise(p, fallback=probs[node])
        if accepted is None:
            return Verdict(path, sample(p, generator))
        path.append(accepted)


def _normalise(p: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = float(p.sum())
    # The mass left after a rejection is > 0 in exact arithmetic (a rejection needs p'(c) < q(c), or < 1);
    # only float rounding could empty it, and then the unadjusted distribution is the closest valid one.
    return p / total if total > 1e-12 else fallback


def _verify_typical(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> Verdict:
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.exp()
    entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, TYPICAL_EPSILON), TYPICAL_DELTA * torch.exp(-entropy))
    tokens = tree.tokens.tolist()
    ok = [True] + [
        bool(probs[tree.parents[i], tokens[i]] > threshold[tree.parents[i]]) for i in range(1, len(tree))
    ]
    score = [0.0] * len(tree)
    depth = tree.depths()
    best, best_key = 0, (0, 0.0)
    for i in range(1, len(tree)):
        parent = tree.parents[i]
        ok[i] = ok[i] and ok[parent]
        score[i] = score[parent] + float(logp[parent, tokens[i]])
        if ok[i] and (depth[i], score[i]) > best_key:
            best, best_key = i, (depth[i], score[i])
    path = tree.path_to(best)
    last = path[-1]
    token = int(logits[last].argmax()) if sampling.greedy else sample(probs[last], generator)
    return Verdict(path, token)
