"""Run a training script with one fault planted at a chosen point (the fault catalogue's kill and disk cases):

    python tests/recipes/_fault.py FAULT train/medusa.py --config ... output_dir=...

FAULT is one of
    kill-checkpoint:STEP   SIGKILL while checkpoint-STEP is half written (its state files are in
                           checkpoint-STEP.tmp, its manifest is not)
    kill-final             SIGKILL while final/ is half written (its weights in final.tmp, its config not)
    pause-checkpoint:STEP  before checkpoint-STEP, create <output_dir>/paused and wait until <output_dir>/go exists
    readonly:STEP          remount the run's filesystem read-only just before checkpoint-STEP
    fill:STEP:FREE         fill the run's filesystem to leave FREE bytes just before checkpoint-STEP
    fill-unestimated:STEP:FREE   the same, and the space estimate says 0 (so the write itself hits the full disk)
    fill-final:FREE        fill the run's filesystem to leave FREE bytes just before final/ is written
    signal:STEP:NAMES[:N]  send the process the signals NAMES (INT, TERM; comma-separated, in that order) N
                           times over (default 1) during optimizer step STEP, as Ctrl-C or a scheduler would

The faults are planted by wrapping draftsmith's own functions in this process only; the product has no
fault-injection code.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _output_dir(argv: list[str]) -> Path:
    return Path(next(a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")))


def _before_checkpoint(step: int, action: Callable[[Path], object]) -> None:
    import draftsmith.train.core.loop as loop

    original = loop.save_checkpoint

    def wrapped(accelerator, output_dir, at_step, *args, **kwargs):
        if at_step == step:
            action(Path(output_dir))
        return original(accelerator, output_dir, at_step, *args, **kwargs)

    loop.save_checkpoint = wrapped  # type: ignore[assignment]  # a spy with the same call signature


def _fill(directory: Path, free: int) -> None:
    import shutil

    left = shutil.disk_usage(directory).free
    with open(directory.parent / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, left - free))


def plant(fault: str, argv: list[str]) -> None:
    kind, *params = fault.split(":")
    if kind == "kill-checkpoint":
        import draftsmith.train.core.checkpointing as checkpointing

        write_manifest = checkpointing.write_manifest

        def killing_manifest(directory, fmt):
            if directory.name == f"checkpoint-{params[0]}.tmp":
                os.kill(os.getpid(), signal.SIGKILL)
            write_manifest(directory, fmt)

        checkpointing.write_manifest = killing_manifest
    elif kind == "kill-final":
        import draftsmith.models.checkpoint as checkpoint

        record_hashes = checkpoint.record_hashes

        def killing_hashes(directory, names):
            if directory.name == "final.tmp":
                os.kill(os.getpid(), signal.SIGKILL)
            return record_hashes(directory, names)

        checkpoint.record_hashes = killing_hashes
    elif kind == "pause-checkpoint":

        def pause(out: Path) -> None:
            (out / "paused").touch()
            while not (out / "go").exists():
                time.sleep(0.05)

        _before_checkpoint(int(params[0]), pause)
    elif kind == "readonly":
        _before_checkpoint(
            int(params[0]),
            lambda out: subprocess.run(["mount", "-o", "remount,ro", str(out.parent)], check=True),
        )
    elif kind in ("fill", "fill-unestimated"):
        _before_checkpoint(int(params[0]), lambda out: _fill(out, int(params[1])))
        if kind == "fill-unestimated":
            import draftsmith.train.core.checkpointing as checkpointing

            checkpointing.estimate_checkpoint_bytes = lambda output_dir, model: 0
    elif kind == "fill-final":
        import draftsmith.train.core.entry as entry

        save_final = entry._save_final

        def filling_save_final(output_dir, *args, **kwargs):
            _fill(Path(output_dir), int(params[0]))
            return save_final(output_dir, *args, **kwargs)

        entry._save_final = filling_save_final
    elif kind == "signal":
        times = int(params[2]) if len(params) > 2 else 1
        signals = [getattr(signal, f"SIG{name}") for name in params[1].split(",")] * times
        _signal_during_step(int(params[0]), signals)
    else:
        raise SystemExit(f"unknown fault {fault!r}")


def _signal_during_step(step: int, signals: list[signal.Signals]) -> None:
    import draftsmith.train.core.loop as loop

    original = loop._optimizer_step

    def wrapped(run, at_step, *args, **kwargs):
        if at_step + 1 == step:  # at_step counts the steps done before this one
            for sig in signals:
                os.kill(os.getpid(), sig)
        return original(run, at_step, *args, **kwargs)

    loop._optimizer_step = wrapped  # type: ignore[assignment]  # a spy with the same call signature


if __name__ == "__main__":
    fault, script, *args = sys.argv[1:]
    plant(fault, args)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
