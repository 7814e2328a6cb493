"""Resumable training checkpoints: `checkpoint-<step>/` written atomically, keep-last-N, resume lookup.

A checkpoint holds the training state (train_state.py: safetensors and JSON, no pickle; FSDP / DeepSpeed runs:
accelerate's `save_state`, which pickles) plus `trainer_state.json` (step and data position), the resolved
`config.yaml` and `manifest.json` (sha256 of every file). It is written into `checkpoint-<step>.tmp/` and
renamed when complete, so a run killed mid-write leaves either the previous checkpoints or the new one, never
a half-written directory that resume would pick up; a checkpoint damaged later fails its manifest and
`--resume` falls back to the newest intact one.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from draftsmith.models.checkpoint import commit_dir
from draftsmith.models.errors import UserError

from .train_state import (
    FORMAT,
    PICKLED,
    DamagedCheckpoint,
    pickled_files,
    save_training_state,
    verify_manifest,
    write_manifest,
)

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
    model: Any,
    optimizer: Any,
    scheduler: Any,
    sharded: bool,
) -> Path:
    """Save the full training state at `step` (a collective call: every rank must enter it). `sharded`: the
    drafter or its optimizer is split across ranks (FSDP / DeepSpeed), so accelerate writes it."""
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"checkpoint-{step}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    if sharded:
        accelerator.save_state(str(tmp))
    else:
        save_training_state(tmp, accelerator.unwrap_model(model), optimizer, scheduler,
                            accelerator.process_index, accelerator.is_main_process)  # fmt: skip
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_NAME).write_text(json.dumps(trainer_state, indent=2) + "\n")
        (tmp / "config.yaml").write_text(config_yaml)
        write_manifest(tmp, PICKLED if sharded else FORMAT)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        commit_dir(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resolve_resume(
    output_dir: Path, resume: str | None, trust_pickle: bool = False
) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from (None: start fresh) and a notice to print, if any.

    Args:
        output_dir: the run directory.
        resume: None (start fresh; refuse if the directory already holds checkpoints, so a finished or
            interrupted run is never silently overwritten), "latest" (the newest intact checkpoint, or a fresh
            start if there is none), or a checkpoint directory.
        trust_pickle: allow a checkpoint holding pickle files (FSDP / DeepSpeed, or written by draftsmith
            before 0.2), which can run code when loaded.

    Raises:
        UserError: the named checkpoint is damaged, or holds pickles and `trust_pickle` is off.
    """
    existing = list_checkpoints(output_dir)
    if resume is None:
        if existing:
            raise ValueError(
                f"{output_dir} already holds {existing[-1].name}: pass --resume to continue that run, "
                "or choose another output_dir"
            )
        return None, None
    if resume == "latest":
        notices = []
        for ckpt in reversed(existing):
            try:
                _check_checkpoint(ckpt, trust_pickle)
            except DamagedCheckpoint as err:
                notices.append(f"note: skipping damaged {ckpt.name}: {err}")
                continue
            return ckpt, "\n".join(notices) or None
        if existing:
            raise UserError("no intact checkpoint to resume: " + "; ".join(notices))
        return None, None
    path = Path(resume)
    if not (path / STATE_NAME).is_file():
        raise FileNotFoundError(
            f"--resume {resume}: no {STATE_NAME} there; not a complete checkpoint directory"
        )
    _check_checkpoint(path, trust_pickle)
    return path, None


def checkpoint_format(ckpt: Path) -> str:
    """FORMAT (safetensors and JSON), PICKLED (accelerate's), or "legacy" (no manifest: before 0.2)."""
    try:
        return str(json.loads((ckpt / "manifest.json").read_text()).get("format"))
    except FileNotFoundError:
        return "legacy"


def _check_checkpoint(ckpt: Path, trust_pickle: bool) -> None:
    fmt = checkpoint_format(ckpt)
    if fmt != "legacy":
        verify_manifest(ckpt)
    pickles = pickled_files(ckpt)
    if pickles and not trust_pickle:
        raise UserError(
            f"{ckpt} holds pickle files ({', '.join(pickles[:3])}{', ...' if len(pickles) > 3 else ''}), which run "
            "code when loaded; resume it only if you or your own run wrote it, with --trust-pickle"
        )
    if fmt not in (FORMAT, PICKLED, "legacy"):
        raise UserError(f"{ckpt} has checkpoint format {fmt!r}, which this draftsmith does not read")


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / STATE_NAME).read_text())
