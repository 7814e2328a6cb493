"""A key/value cache for batched generation that appends in place instead of concatenating.

transformers' `DynamicLayer` appends a decoding step's keys and values with `torch.cat`, which copies the whole
cache of that layer at every step: at a batch of 64 answers of ~200 tokens on SmolLM2-135M that is about 10 MB
per layer and step, 60 copies a step. `GrowingLayer` keeps each layer's keys and values in a buffer with room
for the whole answer and hands the model a view of the filled part, so a step writes only its own position.
Measured on greedy answers at a batch of 64 (float32, AVX2 kernels): docs/BENCHMARKS.md, "Appending in place".

`growing_cache(config, room)` is transformers' own `DynamicCache` for the model with every full-attention layer
swapped for a `GrowingLayer`; sliding-window and linear-attention layers (which drop or fold old positions)
stay transformers' own. Everything that reads the cache (`get_seq_length`, the mask sizes, `generate`) sees
`keys` and `values` as it would from `DynamicLayer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A full-attention layer's keys and values in buffers with room for `room` positions (grown by doubling when
    a sequence outgrows them); `keys` / `values` are views of the first `length` positions."""

    def __init__(self, room: int = 0) -> None:
        super().__init__()
        self.room = room
        self.length = 0
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.device, self.is_initialized = key_states.device, True
        end = self.length + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            self.key_buffer = _regrown(self.key_buffer, key_states, self.length, end, self.room)
            self.value_buffer = _regrown(self.value_buffer, value_states, self.length, end, self.room)
        assert self.value_buffer is not None  # allocated together with key_buffer
        self.key_buffer[..., self.length : end, :] = key_states
        self.value_buffer[..., self.length : end, :] = value_states
        self.length = end
        return self._view()

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`keys` and `values` set to (and returned as) the buffers' first `length` positions."""
        assert self.key_buffer is not None and self.value_buffer is not None
        keys, values = self.key_buffer[..., : self.length, :], self.value_buffer[..., : self.length, :]
        self.keys, self.values = keys, values
        return keys, values

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """`fn` applied to both buffers (batch reordering, device moves)."""
        if self.key_buffer is not None and self.value_buffer is not None:
            self.key_buffer, self.value_buffer = fn(self.key_buffer), fn(self.value_buffer)
            self._view()

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.key_buffer is not None:
            self.length = max(0, self.length + tokens_to_remove)
            self._view()

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        self.length = 0
        super().reset()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda t: t[indices.to(t.device)])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def offload(self) -> None:
        self._apply(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        self._apply(lambda t: t.to(self.device, non_blocking=True))


def _regrown(
    old: torch.Tensor | None, states: torch.Tensor, length: int, end: int, room: int
) -> torch.Tensor:
    """A buffer shaped like `states` with at least `end` positions (at least `room`, at least twice the old
    one's), holding the old buffer's first `length` positions."""
    capacity = max(end, room, 2 * old.shape[-2] if old is not None else 0)
    shape = (*states.shape[:-2], capacity, states.shape[-1])
    buffer = states.new_empty(shape)
    if old is not None:
        buffer[..., :length, :] = old[..., :length, :]
    return buffer


def growing_cache(config: Any, room: int) -> DynamicCache:
    """transformers' `DynamicCache` for a model of `config` with each full-attention layer a `GrowingLayer` with
    room for `room` positions (the prompt's width plus the new tokens)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    cache = DynamicCache(config=text)
    cache.layers = [GrowingLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
