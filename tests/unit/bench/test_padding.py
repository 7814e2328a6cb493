"""bench.padding: the padding shares of its three layouts against hand-counted cases."""

import pytest

from bench.padding import epoch_batches, packed_share, padded_share


def test_padded_share_counts_the_positions_past_each_sample():
    # batch [3, 1]: 6 positions, 4 real; batch [2, 2]: no padding -> 2 of 10 positions are padding
    assert padded_share([[3, 1], [2, 2]]) == pytest.approx(0.2)


def test_packed_share_fills_rows_first_fit_decreasing():
    # max_len 4: [3, 2, 1, 1] -> rows [3+1, 2+1] = [4, 3], padded to 4: 1 of 8 positions
    assert packed_share([[1, 3, 1, 2]], max_len=4) == pytest.approx(1 / 8)
    # a sample as long as max_len fills its row alone: [4] and [1] -> rows [4], [1] -> 3 of 8
    assert packed_share([[4, 1]], max_len=4) == pytest.approx(3 / 8)


def test_grouping_pads_less_and_an_epoch_keeps_its_samples():
    lengths = [(i * 37) % 97 + 1 for i in range(512)]
    random, grouped = epoch_batches(lengths, 8, grouped=False), epoch_batches(lengths, 8, grouped=True)
    assert sorted(n for b in grouped for n in b) == sorted(n for b in random for n in b) == sorted(lengths)
    assert padded_share(grouped) < padded_share(random) / 4
