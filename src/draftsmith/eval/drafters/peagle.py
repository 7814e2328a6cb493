"""P-EAGLE as a drafter: one draft pass per step proposes a chain of K tokens (docs/ALGORITHMS-BLOCK.md 2.3).

The draft's cache holds one entry per REAL pair (target feature of position j, committed token j+1), as
EAGLE-3's does (eval/drafters/eagle.py). Before each proposal one forward feeds the pairs committed since the
last one (positions real..n-2, the last carrying the root) and K-1 mask rows at positions n-1..n+K-3, all
causal: row n-2 drafts x_n, the mask row at n-2+d drafts x_{n+d}. The cache is then cropped back to the real
pairs. Mask rows are told apart by their role, never by a token id, so an output token equal to the mask id is
an ordinary token here.

Drafts are the argmax of each row, deterministic at any temperature, so verification uses the point-mass rule
(docs/ALGORITHMS.md 9.4b) and stays lossless. Only chains: a tree would need the draft's distribution at depth
d given each sibling at depth d-1, which one pass over mask rows does not condition on.
"""

from __future__ import annotations

import torch

from draftsmith.models.peagle import PEagleDraft

from ..kv_cache import crop_to
from ..sampling import Sampling
from ..tree import DraftTree, TreeShape, tree_attention
from .base import CachedDrafter, check_depth


class PEagleDrafter(CachedDrafter[PEagleDraft]):
    """`real`: the real pairs in the cache; feature rows `[3H]`."""

    name = "peagle"

    def __init__(self, draft: PEagleDraft):
        super().__init__(draft, draft.feature_layers)
        self.max_depth: int | None = draft.config.num_depths

    @torch.no_grad()
    def chain_logits(self, context: list[int], depth: int) -> torch.Tensor:
        """Draft-vocabulary logits `[depth, Vd]` of depths 1..depth after the root `context[-1]`, in one pass."""
        feats = self.features.rows(context, "P-EAGLE")
        n = len(context)
        crop_to(self.cache, self.real)
        new = feats[self.real :]
        m, k = new.shape[0], depth - 1
        hidden = torch.cat([self.draft.project(new), self.draft.mask_state()[None].expand(k, -1)])
        ids = torch.tensor([context[self.real + 1 :] + [0] * k], device=self.device)
        is_mask = torch.arange(m + k, device=self.device)[None] >= m
        emb = self.draft.embed(ids, is_mask, hidden.dtype)
        positions = torch.arange(self.real, self.real + m + k, device=self.device)[None]
        mask = tree_attention(
            torch.ones(m + k, m + k, dtype=torch.bool).tril(), self.real, self.dtype, self.device
        )
        out = self.draft.run(hidden[None], emb, positions, mask, self.cache)[0]
        self.real = n - 1
        crop_to(self.cache, self.real)  # keep the real pairs; drop the mask rows
        return self.draft.logits(out[m - 1 :]).float()

    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        if not shape.is_chain or shape.sampled:
            raise ValueError(
                f"--tree {shape.name}: P-EAGLE drafts one chain per pass (its rows do not condition on the "
                "token drafted before them); use --tree chain"
            )
        check_depth(self, shape)
        if shape.depth == 0:
            return DraftTree(torch.tensor([context[-1]]), [-1])
        drafts = self.draft.to_target_ids(self.chain_logits(context, shape.depth).argmax(-1)).tolist()
        return DraftTree(torch.tensor([context[-1], *drafts]), list(range(-1, shape.depth)))
