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


def train_cmd(nproc: int = 1, method: str = "medusa", engine: str | None = None) -> list[str]:
    """The command a user runs: the script alone, or `accelerate launch --config_file
    recipes/accelerate/<engine>.yaml` (default ddp for several processes)."""
    script = str(REPO / "train" / f"{method}.py")
    if nproc == 1 and engine is None:
        return [sys.executable, script]
    config = REPO / "recipes" / "accelerate" / f"{engine or 'ddp'}.yaml"
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(nproc),
        "--main_process_port",
        "0",
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
    engine: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    args = [
        *train_cmd(nproc, method, engine),
        "--config",
        str(REPO / "recipes" / recipe),
        f"target.path={target}",
        f"output_dir={out}",
        *overrides,
    ]
    proc = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert not check or proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT\n{proc.stdout[-3000:]}\nSTDERR\n{proc.stderr[-5000:]}"
    )
    return proc


def assert_runs_match(a_dir: Path, b_dir: Path, steps: int) -> None:
    """Two runs logged the same per-step losses and token counts and ended with the same weights (the
    distributed-invariance oracle: 2 ranks x micro-batch == 1 rank x accumulation)."""
    import pytest
    import torch
    from safetensors.torch import load_file

    from draftsmith.train.core.metrics import read_metrics

    a = [r for r in read_metrics(a_dir / "metrics.jsonl") if "train/loss" in r]
    b = [r for r in read_metrics(b_dir / "metrics.jsonl") if "train/loss" in r]
    assert len(a) == len(b) == steps
    for ra, rb in zip(a, b, strict=True):
        assert ra["train/loss"] == pytest.approx(rb["train/loss"], abs=1e-5), (
            ra["step"],
            ra["train/loss"],
            rb["train/loss"],
        )
        assert ra["train/tokens"] == rb["train/tokens"]
    assert a[-1]["train/loss"] < a[0]["train/loss"]  # it trained
    wa = load_file(str(a_dir / "final" / "model.safetensors"))
    wb = load_file(str(b_dir / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)


# The run-safety cases: a short Medusa-1 run with a checkpoint every 2 of its 6 steps, each step logged.
SHORT = ["train.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=3", "log.every=1"]


def same_weights(a_run: Path, b_run: Path) -> bool:
    """Two runs' final/ weights are bit-identical."""
    import torch
    from safetensors.torch import load_file

    a = load_file(str(a_run / "final" / "model.safetensors"))
    b = load_file(str(b_run / "final" / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
