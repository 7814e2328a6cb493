"""bench.copy_steps: prompt lookup's accepted count on the drafter's own decoding contexts, and the grouped
table, on a hand-computed answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.copy_steps import accepted_prefix, group, step_rows, table


def test_accepted_prefix():
    assert accepted_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert accepted_prefix([1, 2], [1, 2, 3, 4]) == 2
    assert accepted_prefix([5], []) == 0


def test_prompt_lookup_on_each_step_s_context():
    # prompt 1 2 3 4; the answer 9 1 2 3 4 7 8, the prefill committing 9. Step 1 (context ...4 9): nothing of
    # "4 9" or "9" occurred before, no draft. Step 2 (... 9 1): the 1-gram 1 at position 0 drafts 2 3 4 9 1,
    # of which the answer confirms 2 3 4. Step 3 (... 1 2 3 4): the 3-gram 2 3 4 drafts 9 1 2 3 4 against 7 8.
    steps = [SimpleNamespace(accepted=a, committed=c) for a, c in ((0, 1), (2, 3), (1, 2))]
    turn = SimpleNamespace(
        prompt=[1, 2, 3, 4], spec=SimpleNamespace(tokens=[9, 1, 2, 3, 4, 7, 8], steps=steps)
    )
    rows = step_rows([turn])
    assert rows == [{"drafter": 0, "ngram": 0}, {"drafter": 2, "ngram": 3}, {"drafter": 1, "ngram": 0}]
    g = group(rows)
    assert g["steps"] == 3 and g["drafter"] == pytest.approx(1.0) and g["ngram"] == pytest.approx(1.0)
    assert g["better"] == pytest.approx(4 / 3)
    # depth 1: 2 of 3 steps accepted; depth 2: 1 of the 2 that reached it; depth 3: 0 of 1; deeper: none reached
    assert g["drafter_by_depth"] == pytest.approx([2 / 3, 0.5, 0.0, None, None])
    t = table(rows)
    assert t["ngram accepts 0"]["steps"] == 2 and t["ngram accepts 3"]["steps"] == 1
    assert t["ngram accepts 5"]["steps"] == 0 and t["ngram accepts 5"]["drafter"] is None
