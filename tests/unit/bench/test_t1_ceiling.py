"""The T>0 ceiling's walk over an answer matches verification's step count, worked by hand."""

import pytest

from bench.t1_ceiling import oracle_steps


@pytest.mark.parametrize(
    ("is_argmax", "depth", "steps"),
    [
        ([False] * 6, 5, 6),  # nothing accepted: one token per step
        ([True] * 12, 5, 2),  # 5 accepted + 1 committed, twice
        ([True, True, False, True, False, False], 5, 3),  # steps commit [T T F], [T F], [F]
        ([True] * 4, 2, 2),  # depth caps the run: [T T T] then the last token
        ([True, True, True], 5, 1),  # the run stops one short of the end: the last token is committed
        ([], 5, 0),
    ],
)
def test_oracle_steps(is_argmax: list[bool], depth: int, steps: int) -> None:
    assert oracle_steps(is_argmax, depth) == steps
