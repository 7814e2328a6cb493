"""The drafter protocol of DESIGN.md section 3, as the evaluator's decoding loop uses it.

Per generated sequence the loop calls `start()`, then after every target forward (the prefill and each
verification) `observe(features)` with the target features of the positions whose next token was just
committed (in order; the last one produced the current root), and before each verification
`propose(context, shape, sampling, generator)`, which returns a `DraftTree` rooted at `context[-1]`.
A drafter keeps whatever caches it needs and brings them up to date from `context` itself.
"""

from __future__ import annotations

from typing import Protocol

import torch

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
            f"--tree {shape.name}: the {drafter.name!r} drafter proposes deterministic candidates, so it has "
            "no distribution to sample children from; use topk:K"
        )
