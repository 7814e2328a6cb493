"""models/growing_cache.py: a layer that appends in place holds exactly what transformers' concatenating
`DynamicLayer` holds (the oracle), through regrowth, cropping and batch reordering, without copying its past at
each step."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from draftsmith.models.growing_cache import GrowingLayer, growing_cache


def _states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # keys and values of different head sizes, as multi-head latent attention has
    return torch.randn(batch, 2, length, 6, generator=g), torch.randn(batch, 2, length, 4, generator=g)


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def _buffer(layer: GrowingLayer) -> torch.Tensor:
    assert layer.key_buffer is not None
    return layer.key_buffer


def _same(a: GrowingLayer, b: DynamicLayer) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    assert all(torch.equal(x, y) for x, y in zip(_kv(a), _kv(b), strict=True))


def test_updates_regrowth_and_edits_hold_what_the_concatenating_layer_holds():
    mine, theirs = GrowingLayer(room=4), DynamicLayer()
    for seed, length in enumerate([5, 1, 1, 3, 1, 9]):  # 5 > room 4: regrown at once, then by doubling
        k, v = _states(3, length, seed)
        got, want = mine.update(k, v), theirs.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        _same(mine, theirs)
    for edit in (
        lambda layer: layer.crop(-2),
        lambda layer: layer.batch_select_indices(torch.tensor([2, 0])),
        lambda layer: layer.batch_repeat_interleave(2),
        lambda layer: layer.reorder_cache(torch.tensor([3, 1, 0, 2])),
    ):
        edit(mine)
        edit(theirs)
        _same(mine, theirs)
        k, v = _states(_kv(mine)[0].shape[0], 1, 99)
        mine.update(k, v)
        theirs.update(k, v)
        _same(mine, theirs)
    mine.reset()
    assert mine.get_seq_length() == 0 and mine.key_buffer is None


def test_a_step_writes_in_place_while_there_is_room():
    layer = GrowingLayer(room=16)
    layer.update(*_states(2, 5, 0))
    before = _buffer(layer).data_ptr()
    for step in range(11):
        keys, _ = layer.update(*_states(2, 1, step + 1))
        assert keys.data_ptr() == before and keys.shape[-2] == 6 + step
    layer.update(*_states(2, 1, 50))  # position 17 of a room of 16: one regrowth, to twice the room
    assert _buffer(layer).data_ptr() != before and _buffer(layer).shape[-2] == 32


def test_only_full_attention_layers_are_swapped():
    from transformers import Gemma2Config
    from transformers.cache_utils import DynamicSlidingWindowLayer

    config = Gemma2Config(
        num_hidden_layers=4,
        sliding_window=8,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=64,
    )
    kinds = [type(layer) for layer in growing_cache(config, 32).layers]
    assert kinds == [DynamicSlidingWindowLayer, GrowingLayer] * 2
