"""EAGLE-1 and EAGLE-3 as drafters: chains, static trees and EAGLE-2 dynamic trees (ALGORITHMS.md 3.6, 4, 5.4).

The draft's KV cache holds one entry per REAL pair (target feature of position j, committed token j+1),
like the reference code's `stable_kv`: after every verification the target features of the newly committed
positions are fed back in one forward, and entries made while drafting are cropped away. Drafting then
feeds the draft's own outputs (EAGLE-1: the predicted feature; EAGLE-3: the pre-norm state `a`, no fc) with
the drafted tokens, at position prefix + depth - 1, each node attending to the real prefix and its own
ancestors (the pattern EAGLE-3's training-time test trains for).

Candidates are the draft's top-ranked tokens, deterministic even at T > 0, so verification uses the
point-mass rule (9.4b), as vLLM's `draft_sample_method: greedy`. A sampled shape (a chain with
`--draft-sample-method probabilistic`, vLLM's `probabilistic`, or `sample:K`) draws the children from the
draft's distribution q, processed like the target's (temperature, top-k, top-p), and verification uses
min(1, p/q). EAGLE-3's reduced vocabulary is mapped back with `id + d2t[id]` (q is zero outside it).
"""

from __future__ import annotations

import torch

from draftsmith.models.eagle import Eagle1Draft
from draftsmith.models.eagle3 import Eagle3Draft

from ..kv_cache import crop_to
from ..sampling import Sampling, sample
from ..tree import DraftTree, TreeShape, tree_attention
from .base import CachedDrafter


class EagleDrafter(CachedDrafter[Eagle1Draft | Eagle3Draft]):
    """`real`: the real pairs in the cache; feature rows `[F]` (EAGLE-1: H, EAGLE-3: 3H)."""

    max_depth: int | None = None

    def __init__(self, draft: Eagle1Draft | Eagle3Draft):
        super().__init__(draft, draft.feature_layers)
        self.name = draft.kind

    # -- the draft network -----------------------------------------------------------------------------

    def _run(
        self, hidden: torch.Tensor, ids: list[int], positions: list[int], mask: torch.Tensor
    ) -> torch.Tensor:
        """Feed `[n, H or F]` inputs with their tokens; the draft's outputs `[n, H]` (extends the cache)."""
        ids_t = torch.tensor([ids], device=self.device)
        pos = torch.tensor([positions], device=self.device)
        if isinstance(self.draft, Eagle3Draft):
            return self.draft.step(hidden[None], ids_t, pos, mask, self.cache)[0]
        return self.draft(hidden[None], ids_t, pos, mask, self.cache)[0]

    def _logp(self, out: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the draft vocabulary `[n, Vd]` (float32)."""
        return torch.log_softmax(self.draft.logits(out).float(), dim=-1)

    def _target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft.to_target_ids(draft_ids) if isinstance(self.draft, Eagle3Draft) else draft_ids

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Feed the real pairs not yet in the cache; the draft output of the last one `[H]` (stands for the
        root's position: its logits rank the depth-1 candidates)."""
        crop_to(self.cache, self.real)
        feats = self.features.rows(context, "EAGLE")
        n = len(context)
        new = feats[self.real :]
        hidden = self.draft.project(new) if isinstance(self.draft, Eagle3Draft) else new
        m = new.shape[0]
        mask = tree_attention(torch.ones(m, m, dtype=torch.bool).tril(), self.real, self.dtype, self.device)
        out = self._run(hidden, context[self.real + 1 :], list(range(self.real, n - 1)), mask)
        self.real = n - 1
        return out[-1]

    # -- proposals -------------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        root_out = self._sync(context)
        if shape.depth == 0:
            return DraftTree(torch.tensor([context[-1]]), [-1])
        if shape.dynamic:
            tree = self._dynamic(context, root_out, shape)
        else:
            draw = sampling if shape.sampled and not sampling.greedy else None
            tree = self._static(context, root_out, shape, draw, generator)
        crop_to(self.cache, self.real)
        return tree

    def _expand(
        self,
        nodes: list[int],
        parents: list[int],
        tokens: list[int],
        outs: dict[int, torch.Tensor],
        fed: list[int],
        depth: list[int],
        base: int,
    ) -> torch.Tensor:
        """Feed tree `nodes` (same depth) after the real prefix and the already `fed` nodes; their outputs."""
        ancestors = DraftTree(torch.tensor(tokens), parents).ancestor_mask()
        keys = fed + nodes
        mask = tree_attention(ancestors[nodes][:, keys], self.real, self.dtype, self.device)
        hidden = torch.stack([outs[parents[c]] for c in nodes])
        out = self._run(hidden, [tokens[c] for c in nodes], [base + depth[c] for c in nodes], mask)
        fed += nodes
        return out

    def _children(
        self, out: torch.Tensor, k: int, draw: Sampling | None, generator: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """k candidate target ids after a node with draft output `out` `[H]`: the top-ranked ones, or (`draw`)
        k samples from q and q itself over the target vocabulary `[V]`."""
        if draw is None:
            return self._target_ids(self._logp(out[None])[0].topk(k).indices).tolist(), None
        q_draft = draw.probs(self.draft.logits(out[None]).float())[0]  # [Vd] (EAGLE-1: the target's V)
        if not isinstance(self.draft, Eagle3Draft):
            return [sample(q_draft, generator) for _ in range(k)], q_draft
        ids = self.draft.to_target_ids(torch.arange(q_draft.shape[0], device=q_draft.device))
        q = q_draft.new_zeros(self.draft.vocab_size).index_copy_(0, ids, q_draft)
        return [int(ids[sample(q_draft, generator)]) for _ in range(k)], q

    def _static(
        self,
        context: list[int],
        root_out: torch.Tensor,
        shape: TreeShape,
        draw: Sampling | None = None,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        """A chain or a rank-path tree: children of a node are its top-ranked next tokens, or samples from q."""
        parents = shape.parents()
        n = len(parents)
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            kids[parents[i]].append(i)
        depth = [0] + [len(p) for p in shape.paths]
        tokens = [context[-1]] + [0] * (n - 1)
        q: list[torch.Tensor | None] = [None] * n
        outs = {0: root_out}
        fed: list[int] = []
        base = self.real - 1  # a node at depth d sits at position (n_context - 2) + d
        for level in range(shape.depth):
            frontier = [i for i in range(n) if depth[i] == level and kids[i]]
            for node in frontier:
                ranks = [shape.paths[c - 1][-1] for c in kids[node]]
                best, q[node] = self._children(outs[node], max(ranks) + 1, draw, generator)
                for child, rank in zip(kids[node], ranks, strict=True):
                    tokens[child] = best[rank]
            feed = [c for node in frontier for c in kids[node] if kids[c]]
            if not feed or level + 1 == shape.depth:
                break
            out = self._expand(feed, parents, tokens, outs, fed, depth, base)
            outs.update({c: out[j] for j, c in enumerate(feed)})
        return DraftTree(torch.tensor(tokens), parents, q)

    def _dynamic(self, context: list[int], root_out: torch.Tensor, shape: TreeShape) -> DraftTree:
        """EAGLE-2: expand the top-K frontier per depth (K children each), keep every child as a candidate,
        then the N best candidates by cumulative log-probability, parents before children."""
        k, budget = shape.dynamic_topk, shape.dynamic_tokens
        tokens, parents, depth, score = [context[-1]], [-1], [0], [0.0]
        outs = {0: root_out}
        fed: list[int] = []
        base = self.real - 1
        frontier = [0]
        for level in range(shape.depth):
            logp = self._logp(torch.stack([outs[f] for f in frontier]))  # [len(frontier), Vd]
            top = logp.topk(k, dim=-1)
            ids = self._target_ids(top.indices).tolist()
            children = []
            for row, parent in enumerate(frontier):
                for j in range(k):
                    tokens.append(ids[row][j])
                    parents.append(parent)
                    depth.append(level + 1)
                    score.append(score[parent] + float(top.values[row, j]))
                    children.append(len(tokens) - 1)
            if level + 1 == shape.depth:
                break
            frontier = sorted(children, key=lambda c: (-score[c], c))[:k]
            out = self._expand(frontier, parents, tokens, outs, fed, depth, base)
            outs.update({c: out[j] for j, c in enumerate(frontier)})
        # Rerank: best `budget` nodes, each only after its parent (a child never scores above its parent,
        # and ties go to the earlier-created node, so this keeps the selection a tree).
        chosen = {0}
        for c in sorted(range(1, len(tokens)), key=lambda c: (-score[c], c)):
            if len(chosen) - 1 == budget:
                break
            if parents[c] in chosen:
                chosen.add(c)
        order = sorted(chosen)
        index = {old: new for new, old in enumerate(order)}
        return DraftTree(
            torch.tensor([tokens[i] for i in order]), [index[parents[i]] if i else -1 for i in order]
        )
