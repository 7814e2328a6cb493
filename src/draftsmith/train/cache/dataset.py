"""Reading an offline feature cache sample by sample: the dataset `FeatureCache.dataset` returns (store.py)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from draftsmith.models.target import LayerId, feature_key

from .format import check_shard, decode


class CachedFeatureDataset(Dataset):
    """Item i: `input_ids`, `loss_mask` and `feat.<lid>` ([T, H], decoded to `dtype`) for each cached layer.

    Shards are memory-mapped and read by slices, so a sample costs reading its own rows only.
    """

    def __init__(
        self,
        directory: Path,
        shards: list[dict[str, Any]],
        layers: list[LayerId],
        dtype: torch.dtype,
        unverified: set[str] | None = None,
    ):
        self.directory = directory
        self.shards = shards
        self.layers = layers
        self.dtype = dtype
        self.unverified = (
            unverified if unverified is not None else set()
        )  # shared with the cache: checked once
        self._starts = [s["samples"][0] for s in shards]
        self._count = shards[-1]["samples"][1] if shards else 0
        self._handles: dict[int, Any] = {}
        self._meta: dict[int, tuple[list[int], dict[str, torch.Tensor]]] = {}

    def __len__(self) -> int:
        return self._count

    def _open(self, k: int) -> tuple[Any, list[int], dict[str, torch.Tensor]]:
        if k not in self._handles:
            entry = self.shards[k]
            if entry["file"] in self.unverified:
                check_shard(self.directory / entry["file"], entry)
                self.unverified.discard(entry["file"])
            handle = safe_open(str(self.directory / entry["file"]), framework="pt")
            scales = {key: handle.get_tensor(key) for key in handle.keys() if key.endswith(".scale")}  # noqa: SIM118
            self._handles[k] = handle
            self._meta[k] = (handle.get_tensor("offsets").tolist(), scales)
        return self._handles[k], *self._meta[k]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self._count:
            raise IndexError(index)
        k = bisect.bisect_right(self._starts, index) - 1
        handle, offsets, scales = self._open(k)
        i = index - self._starts[k]
        a, b = offsets[i], offsets[i + 1]
        item = {
            "input_ids": handle.get_slice("input_ids")[a:b].to(torch.long),
            "loss_mask": handle.get_slice("loss_mask")[a:b].to(torch.bool),
        }
        for lid in self.layers:
            key = feature_key(lid)
            item[key] = decode(handle.get_slice(key)[a:b], scales.get(key + ".scale"), self.dtype)
        return item

    def head(self, n: int) -> CachedFeatureDataset:
        """The first `n` samples (the same shards, read no further)."""
        if n < 1:
            raise ValueError(f"a cache subset needs at least one sample, got {n}")
        return self._view(self.layers, min(n, self._count))

    def stats(self) -> Any:
        """`DataStats` of these samples: count, tokens, trained tokens and the longest, read from the shards'
        offsets and loss masks (no features decoded)."""
        from draftsmith.train.core.data import DataStats

        stats = DataStats()
        for k, entry in enumerate(self.shards):
            first = entry["samples"][0]
            if first >= self._count:
                break
            handle, offsets, _ = self._open(k)
            n = min(entry["samples"][1], self._count) - first
            lengths = [offsets[i + 1] - offsets[i] for i in range(n)]
            stats.samples += n
            stats.tokens += sum(lengths)
            stats.trained_tokens += int(handle.get_slice("loss_mask")[: offsets[n]].sum())
            stats.max_length = max([stats.max_length, *lengths])
        return stats

    def tokens_only(self) -> CachedFeatureDataset:
        """The same samples without their features (cheap: for token statistics such as EAGLE-3's vocabulary)."""
        return self.only([])

    def only(self, layers: Sequence[LayerId]) -> CachedFeatureDataset:
        """The same samples with only `layers` decoded (e.g. `top1` alone for a vocabulary scan)."""
        return self._view(list(layers), self._count)

    def _view(self, layers: list[LayerId], count: int) -> CachedFeatureDataset:
        """The first `count` samples of the same shards, decoding `layers` (opened lazily, as any instance)."""
        view = CachedFeatureDataset(self.directory, self.shards, layers, self.dtype, self.unverified)
        view._count = count
        return view
