"""An independent causal LM as the drafter (and `self`: the target drafting for itself).

The draft keeps its own transformers `DynamicCache` (full-length layers, eval/kv_cache.py). Before drafting it crops the cache to the longest
prefix it shares with the committed context and feeds the rest (accepted tokens and the new root) in one
forward. A chain is then drafted token by token: at T = 0 the argmax, at T > 0 a sample from the draft's
distribution processed exactly like the target's (q), which the verifier needs for min(1, p/q). A tree is
drafted level by level, one forward per depth over that level's nodes with a tree attention mask: top-K
ranked children (deterministic, point-mass rule) or, for `sample:K`, K independent samples from q
(SpecInfer rule). Tree nodes are dropped from the cache afterwards; chain tokens are kept, since the
accepted part of a chain is exactly the next context.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.models.parts import with_cache
from draftsmith.models.target import LayerId

from ..kv_cache import RollbackImpossible, crop_to, new_cache
from ..sampling import Sampling, sample
from ..tree import DraftTree, TreeShape, layer_tree_masks
from .base import refuse_dynamic


class LMDrafter:
    feature_layers: tuple[LayerId, ...] = ()
    max_depth: int | None = None

    def __init__(self, model: Any, name: str = "draft_lm"):
        self.model = model.eval()
        config = model.config
        self.text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        self.name = name
        self.cache: Any = None
        self.cached: list[int] = []  # token ids whose keys/values are in the cache, in position order

    def start(self) -> None:
        self.cache = new_cache(self.model.config)
        self.cached = []

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, ids: list[int], positions: list[int] | None = None, mask: Any = None) -> torch.Tensor:
        """Feed `ids` after the cache; logits `[len(ids), V]` (float32)."""
        kwargs: dict[str, Any] = {}
        if positions is not None:
            kwargs["position_ids"] = torch.tensor([positions], device=self.device)
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            attention_mask=mask,
            **with_cache(self.model, self.cache),
            use_cache=True,
            **kwargs,
        )
        return out.logits[0].float()

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Make the cache hold `context` exactly; return the logits after its last token `[V]`."""
        assert self.cache is not None, "call start() first"
        keep = 0
        limit = min(len(self.cached), len(context) - 1)  # the root must be fed to get its logits
        while keep < limit and self.cached[keep] == context[keep]:
            keep += 1
        if keep < len(self.cached):
            try:
                crop_to(self.cache, keep)
            except RollbackImpossible:  # linear-attention state: start again from the whole context
                self.start()
                keep = 0
        self.cached = list(context)
        return self._forward(context[keep:])[-1]

    def _children(
        self,
        logits: torch.Tensor,
        k: int,
        sampled: bool,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> tuple[list[int], torch.Tensor | None]:
        """k child tokens of a node, and q (the distribution they were drawn from) when sampled."""
        if sampled and not sampling.greedy:
            q = sampling.probs(logits)
            return [sample(q, generator) for _ in range(k)], q
        return logits.topk(k).indices.tolist(), None

    @torch.no_grad()
    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        refuse_dynamic(self, shape)
        root_logits = self._sync(context)
        if shape.depth == 0:
            return DraftTree(torch.tensor([context[-1]]), [-1])
        if shape.is_chain:
            # a chain samples its drafts at T > 0 unless told otherwise (--draft-sample-method greedy)
            sampled = shape.sampled is not False
            return self._chain(context, root_logits, shape.depth, sampled, sampling, generator)
        return self._tree(context, root_logits, shape, sampling, generator)

    def _chain(
        self,
        context: list[int],
        logits: torch.Tensor,
        depth: int,
        sampled: bool,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> DraftTree:
        tokens, q = [context[-1]], []
        for d in range(depth):
            (tok,), dist = self._children(logits, 1, sampled, sampling, generator)
            tokens.append(tok)
            q.append(dist)
            if d + 1 < depth:
                logits = self._forward([tok])[-1]
                self.cached.append(tok)
        return DraftTree(torch.tensor(tokens), list(range(-1, depth)), q + [None])

    def _tree(
        self,
        context: list[int],
        root_logits: torch.Tensor,
        shape: TreeShape,
        sampling: Sampling,
        generator: torch.Generator | None,
    ) -> DraftTree:
        assert self.cache is not None
        shape_parents = shape.parents()
        n = len(shape_parents)
        kids: list[list[int]] = [[] for _ in range(n)]  # shape node -> its child shape nodes, by rank
        for i in range(1, n):
            kids[shape_parents[i]].append(i)
        tokens = [context[-1]] + [0] * (n - 1)
        q: list[torch.Tensor | None] = [None] * n
        depth = [0] + [len(p) for p in shape.paths]
        logits = {0: root_logits}
        fed: list[int] = []  # tree nodes in the cache after the context, in order
        for level in range(shape.depth):
            frontier = [i for i in range(n) if depth[i] == level and kids[i]]
            for node in frontier:
                ranks = [shape.paths[c - 1][-1] for c in kids[node]]
                cands, q[node] = self._children(
                    logits[node], max(ranks) + 1, bool(shape.sampled), sampling, generator
                )
                for child, rank in zip(kids[node], ranks, strict=True):
                    tokens[child] = cands[rank]
            if level + 1 == shape.depth:
                break
            feed = [c for node in frontier for c in kids[node] if kids[c]]
            if not feed:
                break
            ancestors = DraftTree(torch.tensor(tokens), shape_parents).ancestor_mask()
            keys = fed + feed
            base = len(context) - 1
            mask = layer_tree_masks(
                ancestors[feed][:, keys],
                [base + depth[c] for c in feed],
                [base + depth[c] for c in keys],
                len(context),
                self.text_config,
                self.model.dtype,
                self.device,
            )
            out = self._forward([tokens[c] for c in feed], [base + depth[c] for c in feed], mask)
            logits.update({c: out[j] for j, c in enumerate(feed)})
            fed += feed
        self._drop_tree(len(context))
        return DraftTree(torch.tensor(tokens), shape_parents, q)

    def _drop_tree(self, length: int) -> None:
        """Forget the tree nodes fed after the context (a linear-attention draft starts again)."""
        try:
            crop_to(self.cache, length)
        except RollbackImpossible:
            self.start()
