"""runtime/tokens.py: left padding, checked by hand."""

from __future__ import annotations

import torch

from draftsmith.runtime.tokens import left_pad


def test_rows_end_at_the_same_column():
    ids, mask = left_pad([[5, 6, 7], [9]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == torch.long and mask.dtype == torch.long
