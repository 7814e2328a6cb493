"""The offline feature cache's format: its names and version, the storage codec (bf16, or fp8 with per-channel
scales), its error, and the check that a shard holds the bytes its index records. The layout of a cache
directory is described in store.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from draftsmith.models.target import TOP1, LayerId
from draftsmith.runtime.files import sha256_file

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


def check_shard(shard: Path, entry: dict[str, Any]) -> None:
    """Refuse a shard whose bytes are not the ones its index entry records."""
    if sha256_file(shard) != entry["sha256"]:
        raise CacheError(
            f"cache shard {shard} is corrupt: its sha256 differs from the one recorded in {INDEX_NAME}; "
            "delete it and its .json sidecar and run the same `draftsmith cache` command again"
        )
