"""The offline hidden-state cache: what `draftsmith cache` writes and `data.cache=DIR` trains from (the format's
names and codec: format.py; the samples read back: dataset.py).

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

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from draftsmith.models.target import FEATURE_PREFIX, LayerId, feature_key
from draftsmith.runtime.files import atomic_file, sha256_file, write_json
from draftsmith.train.core.data_content import CONTENT_KEY, content_change

from .dataset import CachedFeatureDataset
from .format import (
    FORMAT,
    FORMAT_VERSION,
    INDEX_NAME,
    CacheError,
    Storage,
    check_shard,
    encode,
    parse_layer_id,
)

logger = logging.getLogger(__name__)

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
                check_shard(directory / entry["file"], entry)
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
