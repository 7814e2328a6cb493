"""What a train/<method>.py script hands `train_main`: its config tree and how to build its training method.

Every config tree opens with the same sections and closes with the loop's; a method adds its `draft:` type
and its own sections between them:

    output_dir, seed, target, data, draft      RecipeHead[Draft]
    <the method's own sections>                 a dataclass on RecipeHead[Draft] (e.g. ObjectiveSection)
    train, log, checkpoint, eval               LoopSections

    @dataclass
    class EagleRecipe(RecipeConfig[EagleConfig], ObjectiveSection[EagleConfig]):
        output_dir: str = run_dir("runs/eagle")
        draft: EagleConfig = field(default_factory=EagleConfig)

Keys stand in `--help`, YAML and saved configs in dataclass field order: the fields of the bases in reverse
method resolution order, then the class's own (a field declared again keeps its first place). Because the
method's sections derive from RecipeHead, they come after it and before LoopSections in that order, so a
method's body only sets its defaults (`output_dir`, `seed`'s help) and its `draft` type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from draftsmith.models.objectives import ObjectiveConfig
from draftsmith.models.target import FrozenTarget, LayerId, TargetConfig

from .data import DataBundle, DataConfig
from .method import TrainingMethod
from .settings import LoopSections

DraftT = TypeVar("DraftT")


def run_dir(default: str) -> str:
    """The `output_dir` field with a method's default."""
    out: str = field(default=default, metadata={"help": "Run directory (checkpoints, metrics, final/)."})
    return out


def seed_field(help_text: str) -> int:
    """The `seed` field, saying what the method draws from it."""
    out: int = field(default=0, metadata={"help": help_text})
    return out


def _declared_by_the_method() -> Any:
    raise TypeError("a recipe class declares its own `draft` section (draft: XConfig = field(...))")


@dataclass
class RecipeHead(Generic[DraftT]):
    """The sections every recipe opens with; a method's recipe declares `draft` again with its type."""

    output_dir: str = run_dir("runs")
    seed: int = seed_field("Seed for initialisation, data split and order.")
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    draft: DraftT = field(default_factory=_declared_by_the_method)


@dataclass
class RecipeConfig(LoopSections, RecipeHead[DraftT]):
    """A training recipe's config tree: what `train_main` reads of every method's."""


@dataclass
class ObjectiveSection(RecipeHead[DraftT]):
    """The `objective` section (per-position loss and depth weights) of the methods that take one."""

    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)


ConfigT = TypeVar("ConfigT", bound=RecipeConfig[Any])


def no_target_layers(cfg: object) -> int:
    return 0


def taps_and_final(taps: Sequence[int] | None, default: Callable[[], Sequence[int]]) -> list[LayerId]:
    """What an offline cache holds for a drafter fed by target taps: the configured taps (`draft.feature_layers`;
    null: the method's `default()`), and `final` for the target's logits."""
    return [*(int(i) for i in (taps or default())), "final"]


@dataclass(frozen=True)
class Recipe(Generic[ConfigT]):
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

    config: type[ConfigT]
    prog: str
    description: str
    build_method: Callable[[ConfigT, FrozenTarget, DataBundle], TrainingMethod]
    cache_layers: Callable[[ConfigT, FrozenTarget], list[LayerId]]
    offline_target_layers: Callable[[ConfigT], int] = no_target_layers
