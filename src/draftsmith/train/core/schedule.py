"""Learning-rate schedules as `LambdaLR` multipliers of the step."""

from __future__ import annotations

import math
from typing import Any


def cosine_with_warmup(total_steps: int, warmup_steps: int, min_lr_ratio: float) -> Any:
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to `min_lr_ratio` at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def from_step(start: int, schedule: Any) -> Any:
    """`schedule`, held at 0 before step `start` (a parameter group that joins later)."""

    def factor(step: int) -> float:
        return 0.0 if step < start else float(schedule(step))

    return factor
