"""`draft.copy_weight`'s positions: what prompt lookup drafts after each prefix, against the evaluator's own
ngram drafter, and the per-step weights on a hand-computed case."""

from __future__ import annotations

import pytest
import torch

from draftsmith.eval.drafters.ngram import NgramDrafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.train.prompt_lookup import copy_weights, lookup_next


@pytest.mark.parametrize("seed", range(4))
def test_lookup_next_drafts_what_the_evaluator_s_ngram_drafter_drafts(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4 + seed, (3, 40), generator=g)  # a small vocabulary: many 1-3-gram repeats
    lengths = torch.tensor([40, 25, 1])
    got = lookup_next(ids, lengths)
    ngram = NgramDrafter()  # the evaluator's defaults: 3- to 1-grams, latest occurrence
    for b in range(3):
        for e in range(40):
            conts = ngram.continuations(ids[b, : e + 1].tolist(), 1, 1) if e < lengths[b] else []
            assert int(got[b, e]) == (conts[0][0] if conts else -1), (b, e)
    assert (got[0] >= 0).sum() > 30 and (got[1, 25:] == -1).all()


def test_copy_weights_by_hand():
    # ids 5 6 7 5 6 7 9: after the prefix ending at position 3 (the 1-gram 5 of position 0) lookup drafts 6,
    # after position 4 (the 2-gram 5 6) 7, after position 5 (5 6 7) 5; nothing after positions 0-2 and 6 (9)
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 9]])
    assert lookup_next(ids, torch.tensor([7])).tolist() == [[-1, -1, -1, 6, 7, 5, -1]]
    # step s's label at column t is the token after position t+s+1: the data's tokens, two steps
    labels = torch.stack([torch.tensor([[7, 5, 6, 7, 9, 0, 0]]), torch.tensor([[5, 6, 7, 9, 0, 0, 0]])], -1)
    w = copy_weights(ids, torch.ones_like(ids), labels, 2.0)
    # step 0 reads lookup at t+1: columns 2 (6 == 6) and 3 (7 == 7) copy, column 4 (5 != 9) does not
    assert w[0, :, 0].tolist() == [1, 1, 3, 3, 1, 1, 1]
    # step 1 reads lookup at t+2: columns 1 (6) and 2 (7)
    assert w[0, :, 1].tolist() == [1, 3, 3, 1, 1, 1, 1]
    # a missing label (-1, past the end) where lookup drafts nothing (-1) is not a copy
    missing = torch.full_like(labels, -1)
    assert (copy_weights(ids, torch.ones_like(ids), missing, 2.0) == 1).all()


def test_copy_weight_is_eagle3_s_and_not_negative():
    with pytest.raises(ValueError, match="copy_weight"):
        EagleConfig(version=1, copy_weight=1.0)
    with pytest.raises(ValueError, match="copy_weight"):
        EagleConfig(version=3, copy_weight=-1.0)
