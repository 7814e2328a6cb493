"""The training methods: `draftsmith train METHOD` runs train/METHOD.py, which produces the drafter kinds that
models/families.py assigns to it (`eagle` trains EAGLE-1 and EAGLE-3, `distill` a `draft_lm`)."""

from __future__ import annotations

from draftsmith.models.families import train_methods

TRAIN_METHODS: dict[str, str] = {method: f"draftsmith.train.{method}" for method in sorted(train_methods())}
