"""bench.copy_share: the answer tokens prompt lookup drafts, on a hand-computed conversation."""

from __future__ import annotations

from bench.copy_share import answer_copies


def test_answer_copies_by_hand():
    # prompt 5 6 7 | answer 5 6 7 9: lookup drafts nothing after the prompt's 7 (answer token 5 missed), 6 after
    # the 5 (its 1-gram at 0), 7 after "5 6", and 5 after "5 6 7" (the answer's 9 missed): 2 of 4
    assert answer_copies([5, 6, 7, 5, 6, 7, 9], 3) == (4, 2)
    assert answer_copies([1, 2, 3], 3) == (0, 0)
