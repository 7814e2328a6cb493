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
from transformers import DynamicCache

from draftsmith.models.dflash import DFlashDraft
from draftsmith.models.target import LayerId

from ..kv_cache import crop_to
from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import check_depth, refuse_dynamic, refuse_sampled


class DFlashDrafter:
    name = "dflash"

    def __init__(self, draft: DFlashDraft):
        self.draft = draft.eval()
        self.feature_layers: tuple[LayerId, ...] = tuple(draft.feature_layers)
        self.max_depth: int | None = draft.block_size - 1
        self.cache = DynamicCache()
        self.real = 0  # context rows in the cache
        self.features: list[torch.Tensor] = []  # [m, |T| H] chunks; row j = position j

    @property
    def device(self) -> torch.device:
        return next(self.draft.parameters()).device

    def start(self) -> None:
        self.cache = DynamicCache()
        self.real = 0
        self.features = []

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        dtype = next(self.draft.parameters()).dtype
        self.features.append(torch.cat([features[i] for i in self.feature_layers], dim=-1).to(dtype))

    @torch.no_grad()
    def slot_logits(self, context: list[int], slots: int) -> torch.Tensor:
        """Logits `[slots, V]` of slots 1..slots of the block anchored at the root `context[-1]`."""
        feats = torch.cat(self.features, dim=0)
        self.features = [feats]
        n = len(context)
        if feats.shape[0] != n - 1:
            raise RuntimeError(f"DFlash drafter has {feats.shape[0]} target features for {n} context tokens")
        crop_to(self.cache, self.real)
        new = feats[self.real :][None]
        B = self.draft.block_size
        ids = torch.full((1, B), self.draft.config.mask_token_id, device=self.device, dtype=torch.long)
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
