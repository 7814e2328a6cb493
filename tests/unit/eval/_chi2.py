"""Pearson's chi-square goodness-of-fit test without scipy (Wilson-Hilferty approximation of the tail)."""

from __future__ import annotations

import math

import torch


def chi_square_pvalue(
    observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0
) -> float:
    """p-value of `observed` counts against `expected_probs`; cells with expected count < `min_expected` are
    pooled into one cell. A zero-probability cell with observations gives p = 0."""
    observed = observed.double().flatten()
    probs = expected_probs.double().flatten()
    n = observed.sum()
    if bool(((probs == 0) & (observed > 0)).any()):
        return 0.0
    expected = probs * n
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = len(obs) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))
