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
- FP8 key/value layers (`new_cache(..., kv_cache="fp8")`, transformers' `Fp8QuantizedLayer`: the per-tensor
  scale is frozen at the prefill and later positions are quantized one by one with it, as in vLLM's
  `--kv-cache-dtype fp8`): the stored fp8 tensors are sliced or gathered like full-precision ones, which
  leaves exactly what feeding only the kept tokens would have stored. Other quantized layers (quanto / hqq
  re-quantize whole blocks, so a cut inside one cannot be undone) raise `RollbackImpossible`.
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


KV_CACHES = ("auto", "fp8")


def new_cache(config: Any, kv_cache: str = "auto") -> Any:
    """A `DynamicCache` for a model of `config` whose attention layers all keep every position (rollback by
    slicing works), with linear-attention layers where the model has them; `kv_cache="fp8"`: keys and values
    stored in float8 e4m3 with a per-tensor scale (transformers' `Fp8QuantizedLayer`)."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer, Fp8QuantizedLayer

    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache {kv_cache!r}: use one of {', '.join(KV_CACHES)}")
    if kv_cache == "fp8":
        if has_linear_attention(config):
            raise ValueError(
                "--kv-cache fp8 is for attention caches; this target has linear-attention layers: use --kv-cache auto"
            )
        # transformers' QuantizedCache refuses sliding-window models; full-length fp8 layers work for every
        # attention layer type (the model masks windows and chunks from the positions, as with `DynamicCache`).
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        return Cache(layers=[Fp8QuantizedLayer() for _ in range(int(text.num_hidden_layers))])
    if not has_linear_attention(config):
        return DynamicCache()  # lazily one full DynamicLayer per decoder layer
    cache = DynamicCache(config=config)
    cache.layers = [
        DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers
    ]
    return cache


def _is_linear(layer: Any) -> bool:
    return hasattr(layer, "recurrent_states")


def _is_fp8(layer: Any) -> bool:
    from transformers.cache_utils import Fp8QuantizedLayer

    return isinstance(layer, Fp8QuantizedLayer)


def _quantized_other(layer: Any) -> bool:
    from transformers.cache_utils import BaseQuantizedLayer

    return isinstance(layer, BaseQuantizedLayer) and not _is_fp8(layer)


def _kv(layer: Any) -> bool:
    if _is_fp8(layer):
        return layer._quantized_keys is not None
    return isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.numel() > 0


def _length(layer: Any) -> int:
    return int(layer.cumulative_length) if _is_fp8(layer) else int(layer.keys.shape[-2])


def _select(layer: Any, pick: Any) -> None:
    """Apply `pick` (a function of a `[.., S, d]` tensor) to the layer's stored keys and values."""
    if _is_fp8(layer):
        (k, k_scale), (v, v_scale) = layer._quantized_keys, layer._quantized_values
        layer._quantized_keys, layer._quantized_values = (pick(k), k_scale), (pick(v), v_scale)
        layer.cumulative_length = int(layer._quantized_keys[0].shape[-2])
    else:
        layer.keys, layer.values = pick(layer.keys), pick(layer.values)


def seq_length(cache: Any) -> int:
    """Positions held by the attention layers (linear-attention layers have no length)."""
    return max((_length(layer) for layer in cache.layers if _kv(layer)), default=0)


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
    _refuse_block_quantized(cache)
    for layer in cache.layers:
        if _kv(layer):
            _select(layer, lambda x: x[..., :length, :])


def _refuse_block_quantized(cache: Any) -> None:
    if any(_quantized_other(layer) for layer in cache.layers):
        raise RollbackImpossible("a block-quantized (quanto / hqq) cache cannot be cut back; re-prefill")


def keep_path(cache: Any, past_len: int, path: list[int]) -> None:
    """Shrink `cache` to its first `past_len` positions followed by the tree nodes `path` (node i was fed at
    position `past_len + i`)."""
    if path == list(range(len(path))):
        crop_to(cache, past_len + len(path))
        return
    if _recurrent(cache):
        raise RollbackImpossible("a linear-attention cache cannot hold a tree; verify chains")
    _refuse_block_quantized(cache)

    def gather(x: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(path, device=x.device) + past_len
        return torch.cat([x[..., :past_len, :], x.index_select(-2, index)], dim=-2)

    for layer in cache.layers:
        if _kv(layer):
            _select(layer, gather)


@dataclass
class Snapshot:
    """Copies of every linear-attention layer's state, and the attention length, at one moment."""

    length: int
    states: list[tuple[int, dict[str, Any]]]


_STATE_FIELDS = (
    "conv_states",
    "recurrent_states",
    "is_conv_states_initialized",
    "is_recurrent_states_initialized",
    "has_previous_state",
    "conv_kernel_size",
    # transformers >= 5.25 counts the tokens a linear-attention layer has seen (`get_seq_length` of a hybrid
    # cache whose first layer is linear); left behind by a restore, it shifts every later position.
    "cumulative_length_linear",
)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def snapshot(cache: Any) -> Snapshot:
    """What `restore` needs to put `cache` back as it is now (cheap: linear-attention state is O(1) in length)."""
    states = []
    for i, layer in enumerate(cache.layers):
        if _is_linear(layer):
            states.append(
                (i, {name: _copy(getattr(layer, name)) for name in _STATE_FIELDS if hasattr(layer, name)})
            )
    return Snapshot(seq_length(cache), states)


def restore(cache: Any, snap: Snapshot) -> None:
    """Put `cache` back to `snap`: attention layers cut to its length, linear-attention state copied back."""
    for layer in cache.layers:
        if _kv(layer):
            _select(layer, lambda x: x[..., : snap.length, :])
    for i, copy in snap.states:
        for name, value in copy.items():
            setattr(cache.layers[i], name, _copy(value))
