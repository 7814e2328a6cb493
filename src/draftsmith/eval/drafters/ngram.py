"""Prompt lookup (n-gram) drafting: propose what followed an earlier occurrence of the context's tail.

No training, no model: the baseline every trained drafter must beat. For n from `max_ngram` down to
`min_ngram` the last n tokens are searched for earlier in the context (prompt and generated text), most
recent match first (`match="latest"`) or, as vLLM's n-gram proposer does, the earliest occurrence of the
longest match first (`match="earliest"`); the tokens that followed a match are the draft. With a tree shape of K alternatives
(topk:K, paths:FILE) the K most recent distinct continuations are merged into a trie (at most `depth`
tokens each), so the tree's node count never exceeds the shape's.
"""

from __future__ import annotations

import torch

from draftsmith.models.target import LayerId

from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import refuse_dynamic, refuse_sampled


class NgramDrafter:
    name = "ngram"
    feature_layers: tuple[LayerId, ...] = ()
    max_depth: int | None = None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, match: str = "latest"):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if match not in ("latest", "earliest"):
            raise ValueError(f"ngram match must be 'latest' or 'earliest', got {match!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.match = match

    def start(self) -> None:
        pass

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        pass

    def continuations(self, context: list[int], depth: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations (each 1..depth tokens), longest n-gram first, then the latest
        (or, `match="earliest"`, the earliest) occurrence first."""
        found: list[list[int]] = []
        if depth == 0:
            return found
        ctx = torch.tensor(context)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            windows = ctx.unfold(0, n, 1)[:-1]  # every earlier n-gram start (the tail itself excluded)
            starts = (windows == ctx[-n:]).all(dim=1).nonzero().flatten().tolist()
            for start in reversed(starts) if self.match == "latest" else starts:
                cont = context[start + n : start + n + depth]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) == limit:
                        return found
        return found

    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        refuse_sampled(self, shape)
        refuse_dynamic(self, shape)
        tokens, parents = [context[-1]], [-1]
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node: the trie
        for cont in self.continuations(context, shape.depth, shape.max_rank()):
            node = 0
            for tok in cont:
                if (node, tok) not in children:
                    children[(node, tok)] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                node = children[(node, tok)]
        return DraftTree(torch.tensor(tokens), parents)
