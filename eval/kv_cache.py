"""Keeping the target's transformers cache equal to the committed sequence after a verification.

A verification forward appends every tree node to the cache; afterwards only the accepted path may stay,
in contiguous positions right after the prefix, because the next forward assumes position i of the cache
is token i of the sequence. A chain's accepted path is a prefix of what was fed, so `Cache.crop` does it;
a tree's accepted path is scattered, so its entries are gathered (transformers has no sequence-axis
gather for caches, hence this helper; Medusa and EAGLE copy the same slots in their own caches).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def crop_to(cache: Any, length: int) -> None:
    """Drop everything after the first `length` positions of `cache`.

    `Cache.crop` changed meaning across transformers releases: it took the length to keep
    (`crop(max_length)`), and now takes the number of positions to drop as a negative int.
    """
    surplus = cache.get_seq_length() - length
    if surplus <= 0:
        return
    if "max_length" in inspect.signature(cache.crop).parameters:
        cache.crop(length)
    else:
        cache.crop(-surplus)


def keep_path(cache: Any, past_len: int, path: list[int]) -> None:
    """Shrink `cache` to its first `past_len` positions followed by the tree nodes `path` (node i was fed at
    position `past_len + i`)."""
    if path == list(range(len(path))):
        crop_to(cache, past_len + len(path))
        return
    for layer in cache.layers:
        index = torch.tensor(path, device=layer.keys.device) + past_len
        layer.keys = torch.cat([layer.keys[..., :past_len, :], layer.keys.index_select(-2, index)], dim=-2)
        layer.values = torch.cat(
            [layer.values[..., :past_len, :], layer.values.index_select(-2, index)], dim=-2
        )
