"""What a train/<method>.py script hands `train_main`: its config tree and how to build its training method."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftsmith.models.target import FrozenTarget, LayerId

from .data import DataBundle
from .method import TrainingMethod


def no_target_layers(cfg: Any) -> int:
    return 0


@dataclass(frozen=True)
class Recipe:
    """A training recipe.

    Attributes:
        config: the recipe's config dataclass tree (YAML under recipes/<method>/ mirrors it).
        prog: the command's name in `--help` and errors (`draftsmith train medusa`).
        description: the `--help` text (the script's docstring).
        build_method: `(cfg, target, data) -> TrainingMethod`, called before any sharding (a drafter may copy
            target weights).
        cache_layers: `(cfg, target) -> layer ids` the drafter reads: what an offline `data.cache` must hold.
        offline_target_layers: how many of the target's first decoder layers to load even when training from a
            cache (a draft LM initialised from them); 0 for the others.
    """

    config: type
    prog: str
    description: str
    build_method: Callable[[Any, FrozenTarget, DataBundle], TrainingMethod]
    cache_layers: Callable[[Any, FrozenTarget], list[LayerId]]
    offline_target_layers: Callable[[Any], int] = no_target_layers
