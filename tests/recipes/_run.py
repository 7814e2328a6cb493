"""Helpers for end-to-end tests: run recipes in subprocesses exactly as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    e = dict(os.environ)
    # One thread per process: two processes share the 2 CI cores, and results stay bit-reproducible.
    e.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    return e


def train_cmd(nproc: int = 1, method: str = "medusa") -> list[str]:
    script = str(REPO / "train" / f"{method}.py")
    if nproc == 1:
        return [sys.executable, script]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        script,
    ]


def run_recipe(
    target: Path,
    out: Path,
    *overrides: str,
    nproc: int = 1,
    timeout: int = 600,
    method: str = "medusa",
    recipe: str = "medusa/tiny.yaml",
) -> subprocess.CompletedProcess:
    args = [
        *train_cmd(nproc, method),
        "--config",
        str(REPO / "recipes" / recipe),
        f"target.path={target}",
        f"output_dir={out}",
        *overrides,
    ]
    proc = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT\n{proc.stdout[-3000:]}\nSTDERR\n{proc.stderr[-5000:]}"
    )
    return proc
