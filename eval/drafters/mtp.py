"""MTP modules as a drafter: a chain of up to D tokens (ALGORITHMS.md 7.1).

Drafting runs the training computation itself on the committed context followed by the draft tokens: module k
reads h^{k-1} and the tokens shifted by k, so with context x_0..x_n (x_n just committed) and target features
h^0_0..h^0_{n-1}, module 1's output at column n-1 gives draft 1, module 2's at column n-1 (fed draft 1)
gives draft 2, and so on. Every module is recomputed over the whole context at each step: exact by
construction (no cache can drift from what training saw), at the cost of D one-layer forwards over the
context per step. Candidates are the modules' argmax tokens, deterministic at any temperature, so
verification uses the point-mass rule (9.4b).
"""

from __future__ import annotations

import torch

from draftsmith.models.mtp import MTPDraft
from draftsmith.models.target import LayerId

from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import check_depth, refuse_dynamic, refuse_sampled


class MTPDrafter:
    name = "mtp"

    def __init__(self, draft: MTPDraft):
        self.draft = draft.eval()
        self.feature_layers: tuple[LayerId, ...] = tuple(draft.feature_layers)
        self.max_depth: int | None = draft.config.num_modules
        self.features: list[torch.Tensor] = []  # [m, H] chunks; feature j pairs with context[j + 1]

    def start(self) -> None:
        self.features = []

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        self.features.append(features[self.feature_layers[0]])

    @torch.no_grad()
    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        check_depth(self, shape)
        refuse_sampled(self, shape)
        refuse_dynamic(self, shape)
        if any(len(p) != d + 1 for d, p in enumerate(shape.paths)):
            raise ValueError(f"--tree {shape.name}: the mtp drafter drafts chains only; use --tree chain")
        feats = torch.cat(self.features, dim=0)
        self.features = [feats]
        n = len(context) - 1  # features exist for columns 0..n-1
        if feats.shape[0] != n:
            raise RuntimeError(f"MTP drafter has {feats.shape[0]} target features for {n + 1} context tokens")
        param = next(self.draft.parameters())
        tokens = list(context)
        hidden = feats[None].to(param.dtype)
        mask = torch.full((n, n), torch.finfo(param.dtype).min, dtype=param.dtype, device=param.device)
        mask = torch.triu(mask, diagonal=1)[None, None]
        positions = torch.arange(n, device=param.device)[None]
        for k in range(1, shape.depth + 1):
            ids = torch.tensor([tokens[k : k + n]], device=param.device)  # column i holds t_{i+k}
            embeds = self.draft._parts().embed_tokens(ids).to(param.dtype)
            hidden = self.draft.layers[k - 1](hidden, embeds, positions, mask)
            tokens.append(int(self.draft.logits(k, hidden[0, -1]).argmax()))
        return DraftTree(torch.tensor([context[-1], *tokens[len(context) :]]), list(range(-1, shape.depth)))
