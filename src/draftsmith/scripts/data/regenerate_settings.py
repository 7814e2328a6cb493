"""The settings of one `draftsmith data regenerate` run, typed. The command line (regenerate.py's
`build_parser`, which holds every flag's default and help) is read into `RegenerateArgs` once, at the
command's edge; the local and the endpoint paths take that."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from draftsmith.data.regen_output import Sampling


@dataclass(frozen=True)
class RegenerateArgs:
    """Every flag of `draftsmith data regenerate`, in `--help` order."""

    target: str | None
    endpoint: str | None
    api_key_env: str | None
    model: str | None
    serve: str | None
    concurrency: int
    timeout: float
    retries: int
    data: str
    format: str
    out: Path
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    batch_size: int
    max_samples: int | None
    retry_failed: bool
    seed: int
    trust_remote_code: bool
    device: str | None
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    compile: Literal["auto", "on", "off"]
    no_progress: bool

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> RegenerateArgs:
        """The settings `build_parser().parse_args(...)` read (a flag without a field fails here)."""
        return cls(**vars(args))

    @property
    def sampling(self) -> Sampling:
        """What is asked of the target, as OUT.meta.json records it."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.max_new_tokens, self.seed)
