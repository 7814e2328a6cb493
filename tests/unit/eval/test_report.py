"""The report's tau standard error against a hand computation and its invariants."""

from __future__ import annotations

import pytest

from draftsmith.eval.decoder import Generation, Step
from draftsmith.eval.report import tau_stderr


def gen(committed: list[int]) -> Generation:
    steps = [
        Step(draft_tokens=4, depth=4, accepted=c - 1, committed=c, cache_len=0, draft_s=0, verify_s=0)
        for c in committed
    ]
    return Generation(tokens=[0] * (sum(committed) + 1), steps=steps)


def test_tau_stderr_by_hand():
    # answers: 6 tokens / 2 steps and 2 tokens / 2 steps -> tau = 8 / 4 = 2; residuals c - 2n = +2, -2;
    # SE = sqrt(2 / 1 * (4 + 4)) / 4 = 1.0
    assert tau_stderr([gen([3, 3]), gen([1, 1])]) == pytest.approx(1.0)


def test_tau_stderr_is_zero_when_every_answer_has_the_same_tau_and_undefined_for_one():
    assert tau_stderr([gen([2, 4]), gen([3]), gen([1, 5, 3])]) == pytest.approx(0.0)
    assert tau_stderr([gen([2, 4])]) is None


def test_tau_stderr_shrinks_like_one_over_sqrt_answers():
    few = tau_stderr([gen([3, 3]), gen([1, 1])] * 4)
    many = tau_stderr([gen([3, 3]), gen([1, 1])] * 16)
    assert few is not None and many is not None
    assert many == pytest.approx(few / 2, rel=0.05)
