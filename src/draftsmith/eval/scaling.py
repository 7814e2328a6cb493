"""How much data a drafter needs: tau against training tokens, fitted and inverted, with its uncertainty.

Over the range that small drafters are trained on, measured acceptance length grows about linearly in the
logarithm of the training tokens (the EAGLE papers' data ablations, and docs/BENCHMARKS.md "Scaling"):

    tau(N) = a + b * ln(N)

`fit` finds a and b by least squares weighted by each point's standard error (a tau measured on few prompts
counts less); `tokens_for` inverts the line for a goal tau. The uncertainty is a parametric bootstrap: each
point's tau is redrawn from a normal with its standard error, the line refitted, and the spread of the
answers reported (the 10th and 90th percentiles). A flat or falling fit (b <= 0) has no answer: more data of
this kind does not raise tau, and the caller says so. A line in ln(N) cannot saturate, so a prediction far
beyond the measured range is an upper estimate of tau (a lower one of the tokens needed); `predict` reports how
far it extrapolates.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

BOOTSTRAP_DRAWS = 2000
MIN_STDERR = 0.01  # a point reported with no spread (one prompt) still gets this much


@dataclass(frozen=True)
class Point:
    """One trained drafter: its training tokens and its measured tau with the tau's standard error."""

    tokens: float
    tau: float
    stderr: float


@dataclass(frozen=True)
class Line:
    """tau = a + b * ln(tokens)."""

    a: float
    b: float

    def tau(self, tokens: float) -> float:
        return self.a + self.b * math.log(tokens)

    def tokens_for(self, tau: float) -> float | None:
        """The tokens at which the line reaches `tau`; None when it never rises (b <= 0); inf past a float's range."""
        if self.b <= 0:
            return None
        exponent = (tau - self.a) / self.b
        return math.exp(exponent) if exponent < 700 else math.inf


@dataclass(frozen=True)
class Estimate:
    """A value with the 10th-90th percentile range of its bootstrap draws (None where a draw had no answer)."""

    value: float | None
    low: float | None
    high: float | None
    no_answer: float  # the share of draws whose line did not rise


def fit(points: Sequence[Point]) -> Line:
    """The weighted least-squares line through `points` (weights 1 / stderr^2); needs two distinct sizes."""
    if len({p.tokens for p in points}) < 2:
        raise ValueError("a scaling fit needs at least two different training sizes")
    if any(p.tokens <= 0 for p in points):
        raise ValueError("training tokens must be positive")
    w = [1.0 / max(p.stderr, MIN_STDERR) ** 2 for p in points]
    x = [math.log(p.tokens) for p in points]
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x, strict=True)) / sw
    my = sum(wi * p.tau for wi, p in zip(w, points, strict=True)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x, strict=True))
    sxy = sum(wi * (xi - mx) * (p.tau - my) for wi, xi, p in zip(w, x, points, strict=True))
    b = sxy / sxx
    return Line(a=my - b * mx, b=b)


def _bootstrap(points: Sequence[Point], draws: int, seed: int) -> list[Line]:
    rng = random.Random(seed)
    lines = []
    for _ in range(draws):
        noisy = [Point(p.tokens, rng.gauss(p.tau, max(p.stderr, MIN_STDERR)), p.stderr) for p in points]
        lines.append(fit(noisy))
    return lines


def _spread(value: float | None, samples: list[float | None]) -> Estimate:
    answered = sorted(s for s in samples if s is not None)
    no_answer = 1.0 - len(answered) / len(samples) if samples else 1.0
    if not answered:
        return Estimate(value, None, None, no_answer)
    low = answered[int(0.1 * (len(answered) - 1))]
    high = answered[int(0.9 * (len(answered) - 1))]
    return Estimate(value, low, high, no_answer)


def predict(points: Sequence[Point], tokens: float, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> Estimate:
    """tau at `tokens` from the fitted line, with its bootstrap range."""
    lines = _bootstrap(points, draws, seed)
    return _spread(fit(points).tau(tokens), [line.tau(tokens) for line in lines])


def tokens_for(points: Sequence[Point], tau: float, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> Estimate:
    """The training tokens at which the fitted line reaches `tau`, with its bootstrap range (value None when
    the fitted line does not rise; `no_answer` is the share of draws that did not)."""
    lines = _bootstrap(points, draws, seed)
    return _spread(fit(points).tokens_for(tau), [line.tokens_for(tau) for line in lines])


def extrapolation(points: Sequence[Point], tokens: float) -> float:
    """How far `tokens` lies beyond the largest measured size, as a factor (1.0 or less: inside the range)."""
    return tokens / max(p.tokens for p in points)
