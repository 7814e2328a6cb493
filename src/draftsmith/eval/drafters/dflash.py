"""DFlash as a drafter: one draft pass per step proposes up to B-1 tokens (docs/ALGORITHMS-BLOCK.md 1.4).

The draft's cache holds the injected context keys/values of committed tokens only. Before each proposal the
context rows not yet cached (target features of positions real..n-2, where n = len(context)) are fed with the
block `[context[-1], MASK x (B-1)]` at positions n-1..n+B-2 in one forward; the cache is then cropped back to
the context, so the block's rows never outlive the pass and the root (the bonus token, whose target feature
does not exist yet) re-enters as slot 0 of the next block.

Slot d's distribution does not depend on the tokens drafted at slots < d (they are all mask tokens), so a
static tree costs nothing more than a chain: a node at depth d gets the rank-r token of slot d. Candidates are
the draft's top-ranked tokens, deterministic at any temperature, so verification uses the point-mass rule
(docs/ALGORITHMS.md 9.4b) and stays lossless.
"""

from __future__ import annotations

import torch

from draftsmith.models.dflash import DFlashDraft

from ..kv_cache import crop_to
from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import CachedDrafter, check_depth, refuse_dynamic, refuse_sampled


class DFlashDrafter(CachedDrafter[DFlashDraft]):
    """`real`: the context rows in the cache; feature rows `[|T| H]`."""

    name = "dflash"

    def __init__(self, draft: DFlashDraft):
        super().__init__(draft, draft.feature_layers)
        self.max_depth: int | None = draft.block_size - 1

    @torch.no_grad()
    def slot_logits(self, context: list[int], slots: int) -> torch.Tensor:
        """Logits `[slots, V]` of slots 1..slots of the block anchored at the root `context[-1]`."""
        feats = self.features.rows(context, "DFlash")
        n = len(context)
        crop_to(self.cache, self.real)
        new = feats[self.real :][None]
        B = self.draft.block_size
        ids = torch.full((1, B), self.draft.mask_token_id, device=self.device, dtype=torch.long)
        ids[0, 0] = context[-1]
        ctx_pos = torch.arange(self.real, n - 1, device=self.device)[None]
        blk_pos = torch.arange(n - 1, n - 1 + B, device=self.device)[None]
        out = self.draft.run(self.draft.context(new), ctx_pos, ids, blk_pos, None, self.cache)
        self.real = n - 1
        crop_to(self.cache, self.real)  # keep the context rows; drop the block's
        return self.draft.logits(out[0, 1 : slots + 1]).float()

    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        check_depth(self, shape)
        refuse_sampled(self, shape)
        refuse_dynamic(self, shape)
        if shape.depth == 0:
            return DraftTree(torch.tensor([context[-1]]), [-1])
        logits = self.slot_logits(context, shape.depth)
        ranked = logits.topk(shape.max_rank(), dim=-1).indices.tolist()  # [depth, ranks]
        tokens = [context[-1]] + [ranked[len(p) - 1][p[-1]] for p in shape.paths]
        return DraftTree(torch.tensor(tokens), shape.parents())
