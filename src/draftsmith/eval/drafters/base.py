"""The drafter protocol of DESIGN.md section 3, as the evaluator's decoding loop uses it.

Per generated sequence the loop calls `start()`, then after every target forward (the prefill and each
verification) `observe(features)` with the target features of the positions whose next token was just
committed (in order; the last one produced the current root), and before each verification
`propose(context, shape, sampling, generator)`, which returns a `DraftTree` rooted at `context[-1]`.
A drafter keeps whatever caches it needs and brings them up to date from `context` itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

import torch
from torch import nn
from transformers import DynamicCache

from draftsmith.models.target import LayerId

from ..sampling import Sampling
from ..tree import DraftTree, TreeShape


class Drafter(Protocol):
    name: str
    feature_layers: tuple[LayerId, ...]  # target features `observe` needs (empty: none)
    max_depth: int | None  # the deepest draft it can make (None: unbounded)

    def start(self) -> None:
        """Forget the previous sequence."""

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        """Target features `[m, H]` of the positions verified last, whose next tokens are now committed."""

    def propose(
        self, context: list[int], shape: TreeShape, sampling: Sampling, generator: torch.Generator | None
    ) -> DraftTree:
        """A draft tree shaped like `shape`, rooted at `context[-1]` (the last committed token)."""
        ...


class FeatureBuffer:
    """The target features a drafter has observed for the current sequence: row j holds position j's (which
    pairs with the committed token j + 1), the `layers` concatenated; cast to the dtype of `draft`'s parameters
    when one is given (as observed, else).
    """

    def __init__(self, layers: tuple[LayerId, ...], draft: nn.Module | None = None):
        self.layers = layers
        self.draft = draft
        self.chunks: list[torch.Tensor] = []  # [m, F] per `observe`

    def clear(self) -> None:
        self.chunks = []

    def add(self, features: dict[LayerId, torch.Tensor]) -> None:
        rows = torch.cat([features[i] for i in self.layers], dim=-1)
        self.chunks.append(rows if self.draft is None else rows.to(next(self.draft.parameters()).dtype))

    def rows(self, context: list[int], drafter: str) -> torch.Tensor:
        """All rows `[n - 1, F]` for a context of n tokens (kept as one chunk from now on)."""
        feats = torch.cat(self.chunks, dim=0)
        self.chunks = [feats]
        if feats.shape[0] != len(context) - 1:
            raise RuntimeError(
                f"{drafter} drafter has {feats.shape[0]} target features for {len(context)} context tokens"
            )
        return feats


NetT = TypeVar("NetT", bound=nn.Module)


class CachedDrafter(Generic[NetT]):
    """What a drafter that runs `draft` with a KV cache of the committed positions keeps (EAGLE, P-EAGLE,
    DFlash): the cache, how many committed positions it holds (`real`; entries past them are the last proposal's
    and get cropped), and the target features observed; `start` and `observe` of the protocol."""

    def __init__(self, draft: NetT, feature_layers: Iterable[LayerId]):
        self.draft = draft.eval()
        self.feature_layers: tuple[LayerId, ...] = tuple(feature_layers)
        self.cache = DynamicCache()
        self.real = 0
        self.features = FeatureBuffer(self.feature_layers, self.draft)

    @property
    def device(self) -> torch.device:
        return next(self.draft.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.draft.parameters()).dtype

    def start(self) -> None:
        self.cache = DynamicCache()
        self.real = 0
        self.features.clear()

    def observe(self, features: dict[LayerId, torch.Tensor]) -> None:
        self.features.add(features)


def check_depth(drafter: Drafter, shape: TreeShape) -> None:
    if drafter.max_depth is not None and shape.depth > drafter.max_depth:
        raise ValueError(
            f"drafter {drafter.name!r} drafts at most {drafter.max_depth} tokens ahead, but the tree "
            f"{shape.name!r} has depth {shape.depth}: lower --depth to {drafter.max_depth}"
        )


def refuse_dynamic(drafter: Drafter, shape: TreeShape) -> None:
    if shape.dynamic:
        raise ValueError(
            f"--tree {shape.name}: dynamic trees rank candidates by the draft's own confidence along a path, "
            f"which the {drafter.name!r} drafter does not have; use an EAGLE drafter, or topk:K / paths:FILE"
        )


def refuse_sampled(drafter: Drafter, shape: TreeShape) -> None:
    if shape.sampled:
        raise ValueError(
            f"sampled drafts (--tree {shape.name}, --draft-sample-method probabilistic): the {drafter.name!r} "
            "drafter proposes deterministic candidates, so it has no distribution to sample them from; use "
            "--draft-sample-method greedy, or topk:K for a tree"
        )
