"""Resumable training checkpoints: `checkpoint-<step>/` written atomically, keep-last-N, resume lookup.

A checkpoint holds what `accelerator.save_state` writes (model, optimizer, registered scheduler, every
rank's RNG states) plus `trainer_state.json` (step and data position) and the resolved `config.yaml`. It is
written into `checkpoint-<step>.tmp/` and renamed when complete, so a run killed mid-write leaves either
the previous checkpoints or the new one, never a half-written directory that resume would pick up.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from draftsmith.models.checkpoint import commit_dir

STATE_NAME = "trainer_state.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints in `output_dir`, oldest first (temporary `.tmp` directories are ignored)."""
    if not output_dir.is_dir():
        return []
    found = []
    for p in output_dir.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir() and (p / STATE_NAME).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: Path,
    step: int,
    trainer_state: dict[str, Any],
    config_yaml: str,
    keep_last: int,
) -> Path:
    """Save the full training state at `step` (a collective call: every rank must enter it)."""
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / STATE_NAME).write_text(json.dumps(trainer_state, indent=2) + "\n")
        (tmp / "config.yaml").write_text(config_yaml)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        commit_dir(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resolve_resume(output_dir: Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from, or None to start fresh.

    Args:
        output_dir: the run directory.
        resume: None (start fresh; refuse if the directory already holds checkpoints, so a finished or
            interrupted run is never silently overwritten), "latest" (the newest checkpoint, or a fresh start
            if there is none), or a checkpoint directory.
    """
    existing = list_checkpoints(output_dir)
    if resume is None:
        if existing:
            raise ValueError(
                f"{output_dir} already holds {existing[-1].name}: pass --resume to continue that run, "
                "or choose another output_dir"
            )
        return None
    if resume == "latest":
        return existing[-1] if existing else None
    path = Path(resume)
    if not (path / STATE_NAME).is_file():
        raise FileNotFoundError(
            f"--resume {resume}: no {STATE_NAME} there; not a complete checkpoint directory"
        )
    return path


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / STATE_NAME).read_text())
