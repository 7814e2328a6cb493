"""Keeping a transformers cache equal to the committed sequence after a verification.

A verification forward appends every tree node to the cache; afterwards only the accepted path may stay,
in contiguous positions right after the prefix, because the next forward assumes position i of the cache
is token i of the sequence. Three kinds of layer state need three rules:

- Attention keys/values (full, sliding-window and chunked layers alike): sliced or gathered along the
  sequence axis. Caches are built by `new_cache` with FULL-length layers everywhere: transformers'
  sliding-window cache layers drop old keys and cannot be rolled back, while the model masks the window
  itself from the positions, so a full layer computes exactly the same attention.
- Linear-attention state (Qwen3-Next, Qwen3.5: convolution and recurrent state): cannot be rolled back,
  so `snapshot` copies it before a verification and `restore` puts it back; the caller then re-feeds the
  accepted tokens (`CacheRollback`).
- A cache that holds such state and was not snapshotted raises `RollbackImpossible`; the caller re-prefills.

(transformers has no sequence-axis gather for caches and its `crop` refuses both sliding and linear layers,
hence these helpers.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class RollbackImpossible(RuntimeError):
    """The cache holds recurrent state that cannot be cut back to an earlier length."""


def has_linear_attention(config: Any) -> bool:
    """Whether a model of `config` keeps recurrent (linear-attention) state in its cache."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return "linear_attention" in (getattr(text, "layer_types", None) or [])


def new_cache(config: Any) -> Any:
    """A `DynamicCache` for a model of `config` whose attention layers all keep every position (rollback by
    slicing works), with linear-attention layers where the model has them."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if not has_linear_attention(config):
        return DynamicCache()  # lazily one full DynamicLayer per decoder layer
    cache = DynamicCache(config=config)
    cache.layers = [
        DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers
    ]
    return cache


def _is_linear(layer: Any) -> bool:
    return hasattr(layer, "recurrent_states")


def _kv(layer: Any) -> bool:
    return isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.numel() > 0


def seq_length(cache: Any) -> int:
    """Positions held by the attention layers (linear-attention layers have no length)."""
    return max((int(layer.keys.shape[-2]) for layer in cache.layers if _kv(layer)), default=0)


def _recurrent(cache: Any) -> bool:
    return any(
        _is_linear(layer) and any(layer.is_recurrent_states_initialized.values()) for layer in cache.layers
    )


def crop_to(cache: Any, length: int) -> None:
    """Drop everything after the first `length` positions of `cache`.

    Raises:
        RollbackImpossible: the cache holds linear-attention state past `length` (restore a snapshot, or
            start a new cache and re-prefill).
    """
    if seq_length(cache) <= length:
        return
    if _recurrent(cache):
        raise RollbackImpossible(
            "a linear-attention cache cannot be cut back; restore a snapshot or re-prefill"
        )
    for layer in cache.layers:
        if _kv(layer):
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_path(cache: Any, past_len: int, path: list[int]) -> None:
    """Shrink `cache` to its first `past_len` positions followed by the tree nodes `path` (node i was fed at
    position `past_len + i`)."""
    if path == list(range(len(path))):
        crop_to(cache, past_len + len(path))
        return
    if _recurrent(cache):
        raise RollbackImpossible("a linear-attention cache cannot hold a tree; verify chains")
    for layer in cache.layers:
        if not _kv(layer):
            continue
        index = torch.tensor(path, device=layer.keys.device) + past_len
        layer.keys = torch.cat([layer.keys[..., :past_len, :], layer.keys.index_select(-2, index)], dim=-2)
        layer.values = torch.cat(
            [layer.values[..., :past_len, :], layer.values.index_select(-2, index)], dim=-2
        )


@dataclass
class Snapshot:
    """Copies of every linear-attention layer's state, and the attention length, at one moment."""

    length: int
    states: list[tuple[int, dict[str, Any]]]


_STATE_FIELDS = ("conv_states", "recurrent_states", "is_conv_states_initialized",
                 "is_recurrent_states_initialized", "has_previous_state", "conv_kernel_size")  # fmt: skip


def snapshot(cache: Any) -> Snapshot:
    """What `restore` needs to put `cache` back as it is now (cheap: linear-attention state is O(1) in length)."""
    states = []
    for i, layer in enumerate(cache.layers):
        if _is_linear(layer):
            copy = {}
            for name in _STATE_FIELDS:
                value = getattr(layer, name)
                copy[name] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in value.items()}
            states.append((i, copy))
    return Snapshot(seq_length(cache), states)


def restore(cache: Any, snap: Snapshot) -> None:
    """Put `cache` back to `snap`: attention layers cut to its length, linear-attention state copied back."""
    for layer in cache.layers:
        if _kv(layer):
            layer.keys = layer.keys[..., : snap.length, :]
            layer.values = layer.values[..., : snap.length, :]
    for i, copy in snap.states:
        for name, value in copy.items():
            setattr(cache.layers[i], name, {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                            for k, v in value.items()})  # fmt: skip
