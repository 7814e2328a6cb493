"""Medusa-1 heads as a drafter (ALGORITHMS.md section 2.4).

The heads read the target's post-norm feature at the position that produced the root token; head d
(1-based) proposes the token d places after the root. A node at rank path (i_1, .., i_d) gets the i_d-th
ranked token of head d, independent of its parent (the heads never see drafted tokens), so the whole tree
costs one head evaluation per depth. Candidates are deterministic, so T > 0 uses the point-mass rule.
"""

from __future__ import annotations

import torch

from draftsmith.models.medusa import MedusaHeads
from draftsmith.models.target import LayerId

from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import check_depth, refuse_dynamic, refuse_sampled


class MedusaDrafter:
    name = "medusa"
    feature_layers: tuple[LayerId, ...] = ("final",)

    def __init__(self, heads: MedusaHeads):
        self.heads = heads
        self.max_depth: int | None = heads.config.num_heads
        self.feature: torch.Tensor | None = None

    def start(self) -> None:
        self.feature = None

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        self.feature = features["final"][-1]

    @torch.no_grad()
    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        refuse_sampled(self, shape)
        refuse_dynamic(self, shape)
        check_depth(self, shape)
        if self.feature is None:
            raise RuntimeError("MedusaDrafter.propose called before observe(): the loop must prefill first")
        if shape.depth == 0:
            return DraftTree(torch.tensor([context[-1]]), [-1])
        feature = self.feature.to(next(self.heads.parameters()).dtype)
        logits = torch.stack([self.heads.head_logits(feature, d) for d in range(shape.depth)])  # [D, V]
        ranked = logits.topk(shape.max_rank(), dim=-1).indices.tolist()
        tokens = [context[-1]] + [ranked[len(p) - 1][p[-1]] for p in shape.paths]
        return DraftTree(torch.tensor(tokens), shape.parents())
