"""Resumable training checkpoints: `checkpoint-<step>/` written atomically, keep-last-N, resume lookup.

A checkpoint holds the training state (train_state.py: safetensors and JSON, no pickle; FSDP / DeepSpeed runs:
accelerate's `save_state`, which pickles) plus `trainer_state.json` (step and data position), the resolved
`config.yaml` and `manifest.json` (sha256 of every file). It is written into `checkpoint-<step>.tmp/` and
renamed when complete, so a run killed mid-write leaves either the previous checkpoints or the new one, never
a half-written directory that resume would pick up; a checkpoint damaged later fails its manifest and
`--resume` falls back to the newest intact one.

Before writing, the free space is checked against what a checkpoint takes (the newest one's size, or an
estimate from the drafter before the first): a full disk stops the run in one line with both figures, before
anything is written. A disk that fills up (or turns read-only) during the write is reported the same way and
the partial `.tmp` directory is removed, so the earlier checkpoints and the space they need stay intact.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from draftsmith.runtime.errors import DiskFull, UserError, disk_fault, format_bytes, require_space
from draftsmith.runtime.files import commit_dir, write_json, write_text

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


def estimate_checkpoint_bytes(output_dir: Path, model: torch.nn.Module) -> int:
    """Bytes the next checkpoint will take: the newest checkpoint's size, or before the first one the trainable
    weights three times over (the weights and AdamW's two moments), plus 1 MB for the JSON files."""
    existing = list_checkpoints(output_dir)
    if existing:
        return sum(p.stat().st_size for p in existing[-1].rglob("*") if p.is_file())
    return 3 * trainable_bytes(model) + 1_000_000


def trainable_bytes(model: torch.nn.Module) -> int:
    """Bytes of the trainable parameters (what final/ holds; a frozen target inside the drafter is not saved)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def all_ranks(accelerator: Accelerator, work: Callable[[], None]) -> None:
    """Run `work` on every rank and fail on every rank if it failed on any: a rank that raised alone would leave
    the others waiting at the next barrier forever. The failing rank re-raises its own error."""
    error: BaseException | None = None
    try:
        work()
    except Exception as err:  # re-raised below, after the other ranks know
        error = err
    failed = accelerator.reduce(torch.tensor([float(error is not None)], device=accelerator.device), "sum")
    if error is not None:
        raise error
    if float(failed.item()) > 0:
        raise UserError("another process of this run failed here; its error is printed above")


def _intact(output_dir: Path) -> str:
    """What a failed checkpoint write left intact, for its error line."""
    earlier = list_checkpoints(output_dir)
    return f"{earlier[-1].name} and earlier are intact" if earlier else "no earlier checkpoint was written"


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
    drafter or its optimizer is split across ranks (FSDP / DeepSpeed), so accelerate writes it.

    Raises:
        DiskFull: too little free space for the checkpoint (nothing was written), or the disk filled up while
            writing it (the partial checkpoint was removed).
        UserError: the filesystem turned read-only or unwritable while writing.
    """
    final = output_dir / f"checkpoint-{step}"
    tmp = _partial_dir(output_dir, step)
    needed = estimate_checkpoint_bytes(output_dir, accelerator.unwrap_model(model, keep_torch_compile=False))
    all_ranks(accelerator, lambda: _make_room(accelerator, output_dir, step, needed))
    try:
        all_ranks(accelerator, lambda: _write_state(accelerator, tmp, model, optimizer, scheduler, sharded))
        all_ranks(accelerator, lambda: _write_records(accelerator, tmp, trainer_state, config_yaml, sharded))
    except Exception as err:
        disk_full = _discard_partial(accelerator, err, output_dir, step, needed)
        if disk_full is None:
            raise
        raise disk_full from err
    if accelerator.is_main_process:
        commit_dir(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _partial_dir(output_dir: Path, step: int) -> Path:
    """Where checkpoint-<step> is written before the rename that completes it."""
    return output_dir / f"checkpoint-{step}.tmp"


def _make_room(accelerator: Accelerator, output_dir: Path, step: int, needed: int) -> None:
    """Clear a partial checkpoint-<step>.tmp left by a killed run and check the disk can hold `needed` bytes
    (main process)."""
    if accelerator.is_main_process:
        tmp = _partial_dir(output_dir, step)
        if tmp.exists():
            shutil.rmtree(tmp)
        require_space(
            output_dir,
            needed,
            f"checkpoint-{step}",
            f"nothing was written and {_intact(output_dir)}: free some space and continue with --resume",
        )


def _write_state(
    accelerator: Accelerator, tmp: Path, model: Any, optimizer: Any, scheduler: Any, sharded: bool
) -> None:
    """This rank's part of the training state: accelerate's pickles when sharded, else train_state's files."""
    if sharded:
        accelerator.save_state(str(tmp))
    else:
        save_training_state(
            tmp,
            accelerator.unwrap_model(model, keep_torch_compile=False),
            optimizer,
            scheduler,
            accelerator.process_index,
            accelerator.is_main_process,
        )


def _write_records(
    accelerator: Accelerator, tmp: Path, trainer_state: dict[str, Any], config_yaml: str, sharded: bool
) -> None:
    """The step and data position, the resolved config and, last, the manifest of every file (main process)."""
    if accelerator.is_main_process:
        write_json(tmp / STATE_NAME, trainer_state)
        write_text(tmp / "config.yaml", config_yaml)
        write_manifest(tmp, PICKLED if sharded else FORMAT)


def _discard_partial(
    accelerator: Accelerator, err: Exception, output_dir: Path, step: int, needed: int
) -> DiskFull | None:
    """Remove what the failed write `err` left in checkpoint-<step>.tmp; returns the one-line error when the
    disk was at fault (None: a bug, whose own error is re-raised)."""
    message = disk_fault(err)
    if accelerator.is_main_process:
        shutil.rmtree(_partial_dir(output_dir, step), ignore_errors=True)  # frees what the partial write took
    if message is None:
        return None
    size = f" (a checkpoint needs ~{format_bytes(needed)})" if message.startswith("no space") else ""
    return DiskFull(
        f"writing checkpoint-{step} failed: {message}{size}; the partial checkpoint was removed and "
        f"{_intact(output_dir)}: fix the disk and continue with --resume"
    )


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
