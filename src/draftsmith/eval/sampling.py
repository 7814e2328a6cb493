"""How logits become the distribution a token is drawn from, shared by the target (p) and the drafter (q).

Lossless speculative sampling needs p and q processed *identically* and exactly as plain sampling would
process p (ALGORITHMS.md section 9): temperature, then top-k, then top-p, in transformers' own order and
with its own warpers, so "plain sampling" here means what `model.generate(do_sample=True, ...)` does.
Temperature 0 means greedy decoding: no distribution, only argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class Sampling:
    """Decoding settings; `temperature == 0` is greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`[..., V]` logits -> probabilities after temperature / top-k / top-p (float32).

        Raises:
            ValueError: at temperature 0, where there is no distribution to sample from.
        """
        if self.greedy:
            raise ValueError("greedy decoding (temperature 0) has no sampling distribution")
        shape = logits.shape
        scores = logits.reshape(-1, shape[-1]).float()
        if self.temperature != 1.0:
            scores = TemperatureLogitsWarper(self.temperature)(None, scores)
        if self.top_k > 0:
            scores = TopKLogitsWarper(self.top_k)(None, scores)
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(self.top_p)(None, scores)
        return torch.softmax(scores, dim=-1).reshape(shape)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def uniform(generator: torch.Generator | None) -> float:
    """One U[0, 1) draw from `generator` (on the generator's device)."""
    device = generator.device if generator is not None else "cpu"
    return float(torch.rand((), generator=generator, device=device).item())
