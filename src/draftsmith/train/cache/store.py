"""The offline hidden-state cache: what `draftsmith cache` writes and `data.cache=DIR` trains from.

Layout of a cache directory:

    index.json                     format, target identity, layers, storage dtype, data config, the sha256 of
                                   each local data file it was built from (`data_sha256`), and per split
                                   the shards with their sample ranges, token counts, byte sizes and sha256
    train-00000.safetensors        one shard: samples packed along the token axis
    train-00000.json               the shard's index entry, written after the shard (marks it complete)
    eval-00000.safetensors ...

A shard holds `offsets` (int64 [n+1]: sample i is rows offsets[i]:offsets[i+1]), `input_ids` (int32),
`loss_mask` (uint8), `feat.top1` (int32 [tokens], the target's greedy next token, when the recipe trains on it)
and, per cached layer id `lid`, `feat.<lid>`: bf16 `[tokens, H]`, or fp8 e4m3 with
`feat.<lid>.scale` (float32 [H], one scale per hidden channel over the shard: x ~= q * scale, with
scale = amax / 448 so each channel uses e4m3's whole range). Only the layers the drafter reads are
stored, and never full-vocabulary logits: `final` (the post-norm state) is kept instead and the frozen LM
head recomputes the target's logits in the training step (H values per token instead of V).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from draftsmith.models.target import FEATURE_PREFIX, TOP1, LayerId, feature_key
from draftsmith.runtime.files import atomic_file, sha256_file, write_json
from draftsmith.train.core.data_content import CONTENT_KEY, content_change

logger = logging.getLogger(__name__)

FORMAT = "draftsmith-feature-cache"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"

Storage = Literal["bf16", "fp8"]
STORAGE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448 for e4m3fn


class CacheError(ValueError):
    """A cache that cannot be used as it is: missing, truncated, corrupt, or for another target/drafter."""


def parse_layer_id(text: str) -> LayerId:
    if text == "final":
        return "final"
    return TOP1 if text == TOP1 else int(text)


# --- storage codec -------------------------------------------------------------------------------------


def encode(x: torch.Tensor, storage: Storage) -> dict[str, torch.Tensor]:
    """`x` [N, H] as stored: `{"": bf16}` or `{"": fp8 e4m3, ".scale": float32 [H]}` (per-channel); token ids
    (`top1`, [N]) as `{"": int32}` whatever the storage."""
    if not x.is_floating_point():
        return {"": x.to(torch.int32).contiguous()}
    if storage == "bf16":
        return {"": x.to(torch.bfloat16).contiguous()}
    if storage == "fp8":
        x = x.float()
        amax = x.abs().amax(dim=0) if x.shape[0] else torch.zeros(x.shape[1])
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return {"": (x / scale).to(torch.float8_e4m3fn).contiguous(), ".scale": scale.contiguous()}
    raise ValueError(f"unknown cache storage {storage!r}; expected 'bf16' or 'fp8'")


def decode(q: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored features back to `dtype` (the inverse of `encode`, up to rounding); token ids back to int64."""
    if not q.is_floating_point():
        return q.to(torch.long)
    x = q.to(torch.float32)
    if scale is not None:
        x = x * scale
    return x.to(dtype)


# --- planning and writing --------------------------------------------------------------------------------


def plan_shards(lengths: Sequence[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sample ranges `[start, end)` of about `shard_tokens` tokens each (at least one sample).

    A pure function of the lengths, so every process and every resumed run plans the same shards.
    """
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    ranges, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        tokens += n
        if tokens >= shard_tokens:
            ranges.append((start, i + 1))
            start, tokens = i + 1, 0
    if start < len(lengths):
        ranges.append((start, len(lengths)))
    return ranges


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}"


def write_shard(
    directory: Path,
    name: str,
    samples: Sequence[dict[str, torch.Tensor]],
    features: dict[LayerId, list[torch.Tensor]],
    storage: Storage,
    first_sample: int,
) -> dict[str, Any]:
    """Write one shard atomically, then its sidecar entry; return the entry.

    Args:
        samples: `{"input_ids", "loss_mask"}` of each sample, in order.
        features: per layer id, one `[T_i, H]` tensor per sample.
        first_sample: index of `samples[0]` in its split.
    """
    lengths = [len(s["input_ids"]) for s in samples]
    tensors: dict[str, torch.Tensor] = {
        "offsets": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64),
        "input_ids": torch.cat([s["input_ids"] for s in samples]).to(torch.int32),
        "loss_mask": torch.cat([s["loss_mask"] for s in samples]).to(torch.uint8),
    }
    for lid, rows in features.items():
        for suffix, t in encode(torch.cat(rows), storage).items():
            tensors[feature_key(lid) + suffix] = t
    path = directory / f"{name}.safetensors"
    with atomic_file(path) as tmp:
        # One metadata entry: safetensors writes a map's entries in no fixed order, which would change the
        # bytes (and the checksum) of a shard rewritten with the same content.
        save_file(tensors, str(tmp), metadata={"format": f"{FORMAT}:{storage}"})
    entry = {
        "file": path.name,
        "samples": [first_sample, first_sample + len(samples)],
        "tokens": int(sum(lengths)),
        "trained_tokens": int(tensors["loss_mask"].sum()),
        "bytes": path.stat().st_size,
        "feature_bytes": int(
            sum(t.numel() * t.element_size() for k, t in tensors.items() if k.startswith(FEATURE_PREFIX))
        ),
        "sha256": sha256_file(path),
    }
    write_json(directory / f"{name}.json", entry)
    return entry


def completed_entry(directory: Path, name: str) -> dict[str, Any] | None:
    """The sidecar entry of a shard that is complete and intact on disk, else None (to be (re)written)."""
    sidecar, path = directory / f"{name}.json", directory / f"{name}.safetensors"
    if not (sidecar.is_file() and path.is_file()):
        return None
    try:
        entry = json.loads(sidecar.read_text())
    except json.JSONDecodeError:
        return None
    if path.stat().st_size != entry.get("bytes") or sha256_file(path) != entry.get("sha256"):
        logger.warning("cache shard %s is damaged (size or checksum differs); rewriting it", path)
        return None
    return dict(entry)


def write_index(directory: Path, header: dict[str, Any], splits: dict[str, list[dict[str, Any]]]) -> Path:
    """Assemble `index.json` from the shards' entries (after every process finished its shards)."""
    index = {"format": FORMAT, "format_version": FORMAT_VERSION, **header, "splits": {}}
    for split, entries in splits.items():
        index["splits"][split] = {
            "samples": sum(e["samples"][1] - e["samples"][0] for e in entries),
            "tokens": sum(e["tokens"] for e in entries),
            "trained_tokens": sum(e["trained_tokens"] for e in entries),
            "bytes": sum(e["bytes"] for e in entries),
            "feature_bytes": sum(e["feature_bytes"] for e in entries),
            "shards": entries,
        }
    path = directory / INDEX_NAME
    write_json(path, index)
    return path


def _check_shard(shard: Path, entry: dict[str, Any]) -> None:
    if sha256_file(shard) != entry["sha256"]:
        raise CacheError(
            f"cache shard {shard} is corrupt: its sha256 differs from the one recorded in {INDEX_NAME}; "
            "delete it and its .json sidecar and run the same `draftsmith cache` command again"
        )


# --- reading --------------------------------------------------------------------------------------------


@dataclass
class FeatureCache:
    """An opened, verified cache directory."""

    directory: Path
    index: dict[str, Any]
    # Shards whose sha256 is still to be checked, each when a dataset first reads it (`verify=False`).
    unverified: set[str] = field(default_factory=set)

    @classmethod
    def open(
        cls,
        directory: str | Path,
        verify: bool = True,
        progress: bool = True,
        data: Mapping[str, str] | None = None,
    ) -> FeatureCache:
        """Read `index.json` and check every shard: present and of the recorded size (a truncated shard is
        named), and its sha256 (a corrupt one is named): all of them now with `verify`, otherwise each one
        the first time training reads from it, so a large cache starts at once but no sample of a corrupt
        shard is ever trained on. With `data` (the sha256 of the data files a recipe names now), first refuse
        a cache built from other data (`require_data`), before any shard is read.

        Raises:
            CacheError: naming the directory or shard and what to do.
        """
        directory = Path(directory).expanduser()
        path = directory / INDEX_NAME
        if not path.is_file():
            raise CacheError(
                f"data.cache={str(directory)!r} holds no {INDEX_NAME}: build the cache first with "
                "`draftsmith cache METHOD --config RECIPE target.path=... data.cache=DIR` (or finish an "
                "interrupted build by running the same command again)"
            )
        try:
            index = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CacheError(
                f"{path} is not valid JSON ({err}); rerun the `draftsmith cache` command that built it"
            ) from err
        if index.get("format") != FORMAT:
            raise CacheError(f"{path} is not a draftsmith feature cache (format {index.get('format')!r})")
        if index.get("format_version", 0) > FORMAT_VERSION:
            raise CacheError(f"{path} has format_version {index['format_version']}: upgrade draftsmith")
        if data is not None:
            cls(directory, index).require_data(data)
        shards = [s for split in index["splits"].values() for s in split["shards"]]
        for entry in shards:
            shard = directory / entry["file"]
            if not shard.is_file():
                raise CacheError(
                    f"cache shard {shard} is missing; rebuild it with the same `draftsmith cache` command"
                )
            size = shard.stat().st_size
            if size != entry["bytes"]:
                raise CacheError(
                    f"cache shard {shard} is truncated or altered: {size} bytes on disk, {entry['bytes']} recorded; "
                    "delete it and its .json sidecar and run the same `draftsmith cache` command again"
                )
        if verify:
            for entry in tqdm(shards, desc="verify cache", unit="shard", disable=not progress):
                _check_shard(directory / entry["file"], entry)
            return cls(directory, index)
        return cls(directory, index, {entry["file"] for entry in shards})

    @property
    def layers(self) -> list[LayerId]:
        return [parse_layer_id(str(x)) for x in self.index["layers"]]

    @property
    def storage(self) -> str:
        return str(self.index["storage"])

    def require_layers(self, needed: Sequence[LayerId], what: str) -> None:
        missing = [lid for lid in needed if lid not in self.layers]
        if missing:
            raise CacheError(
                f"{what} needs the target's layers {list(needed)} but the cache {self.directory} holds "
                f"{self.layers} (missing {missing}); build a cache with this recipe: "
                "`draftsmith cache METHOD --config RECIPE ... data.cache=NEW_DIR`"
            )

    @property
    def data_sha256(self) -> dict[str, str] | None:
        """The sha256 of each local data file the cache was built from (None: built before they were recorded)."""
        recorded = self.index.get(CONTENT_KEY)
        return dict(recorded) if isinstance(recorded, dict) else None

    def require_data(self, content: Mapping[str, str]) -> None:
        """Refuse, in one line naming the file, to train on this cache when the data files the recipe names now
        (`content`: their sha256) are not those it was built from: edited in place since, or other files."""
        change = content_change(self.data_sha256, content)
        if change:
            raise CacheError(
                f"the cache {self.directory} was built from other data than the recipe names: {change}; build a "
                "cache of this data into a new directory (`draftsmith cache METHOD --config RECIPE ... "
                "data.cache=NEW_DIR`) and train from it"
            )

    def dataset(self, split: str, dtype: torch.dtype = torch.float32) -> CachedFeatureDataset:
        if split not in self.index["splits"]:
            raise CacheError(
                f"cache {self.directory} has no {split!r} split (has {sorted(self.index['splits'])})"
            )
        return CachedFeatureDataset(
            self.directory, self.index["splits"][split]["shards"], self.layers, dtype, self.unverified
        )


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
                _check_shard(self.directory / entry["file"], entry)
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
