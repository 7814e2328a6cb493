"""MTP modules as a drafter: chains and top-k / rank-path trees up to depth D (ALGORITHMS.md 7.1).

Drafting runs the training computation itself on the committed context followed by the draft tokens: module k
reads h^{k-1} and the tokens shifted by k, so with context x_0..x_n (x_n just committed) and target features
h^0_0..h^0_{n-1}, module 1's output at column n-1 gives draft 1, module 2's at column n-1 (fed draft 1)
gives draft 2, and so on; in a tree, module k runs once per depth-(k-1) node, along that node's path.
Every module is recomputed over the whole context at each step: exact by construction (no cache can drift
from what training saw), at the cost of one one-layer forward over the context per internal tree node.
Candidates are the modules' top-ranked tokens, deterministic at any temperature, so verification uses the
point-mass rule (9.4b).
"""

from __future__ import annotations

import torch

from draftsmith.models.mtp import MTPDraft
from draftsmith.models.parts import causal_mask
from draftsmith.models.target import LayerId

from ..sampling import Sampling
from ..tree import DraftTree, TreeShape
from .base import FeatureBuffer, check_depth, refuse_dynamic, refuse_sampled


class MTPDrafter:
    name = "mtp"

    def __init__(self, draft: MTPDraft):
        self.draft = draft.eval()
        self.feature_layers: tuple[LayerId, ...] = tuple(draft.feature_layers)
        self.max_depth: int | None = draft.config.num_modules
        self.features = FeatureBuffer(self.feature_layers)  # rows [H], as observed

    def start(self) -> None:
        self.features.clear()

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        self.features.add(features)

    @torch.no_grad()
    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        check_depth(self, shape)
        refuse_sampled(self, shape)
        refuse_dynamic(self, shape)
        feats = self.features.rows(context, "MTP")
        n = len(context) - 1  # features exist for columns 0..n-1
        param = next(self.draft.parameters())
        mask = causal_mask(n, param.device)
        positions = torch.arange(n, device=param.device)[None]
        parents = shape.parents()
        depth = [0] + [len(p) for p in shape.paths]
        kids: list[list[int]] = [[] for _ in parents]
        for i in range(1, len(parents)):
            kids[parents[i]].append(i)
        tokens = [context[-1]] + [0] * (len(parents) - 1)
        path: dict[int, list[int]] = {0: []}  # drafted tokens from the root to each node
        hidden = {0: feats[None].to(param.dtype)}  # h^{depth(node)} over the n columns, along node's path
        for node in range(len(parents)):  # parents come before children
            if not kids[node]:
                continue
            k = depth[node] + 1  # module k drafts the children of a depth-(k-1) node
            seq = context + path[node]
            ids = torch.tensor([seq[k : k + n]], device=param.device)  # column i holds t_{i+k}
            embeds = self.draft._parts().embed_tokens(ids).to(param.dtype)
            out = self.draft.layers[k - 1](hidden[node], embeds, positions, mask)
            ranks = [shape.paths[c - 1][-1] for c in kids[node]]
            best = self.draft.logits(k, out[0, -1]).topk(max(ranks) + 1).indices.tolist()
            for child, rank in zip(kids[node], ranks, strict=True):
                tokens[child] = best[rank]
                path[child] = path[node] + [best[rank]]
                hidden[child] = out
        return DraftTree(torch.tensor(tokens), parents)
