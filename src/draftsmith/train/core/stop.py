"""Stopping a training run on request: Ctrl-C (SIGINT) or a scheduler's SIGTERM finishes the optimizer step
under way, saves a checkpoint of it and ends with the two commands a user wants next: continue the run, or
write the drafter of the step reached (`final/`) without training further.

A signal only sets a flag (the handler never interrupts a step halfway, so the checkpoint holds a whole
optimizer update); the loop reads it between steps. With several processes the flag is summed over the ranks,
so that all of them stop after the same step and write the checkpoint together. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context in which SIGINT / SIGTERM ask the loop to stop after the current step."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            # A second Ctrl-C stops now (the last checkpoint stays as it was). A SIGTERM never does: under
            # `accelerate launch` the launcher answers the terminal's SIGINT by sending each worker a SIGTERM
            # of its own, and a scheduler that will not wait sends SIGKILL.
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        tqdm.write("stopping after this step, with a checkpoint of it (Ctrl-C again to stop at once)")

    def agreed(self, accelerator: Accelerator) -> bool:
        """Whether any rank was asked to stop: every rank gets the same answer after the same step."""
        if accelerator.num_processes == 1:
            return self.requested
        flag = torch.tensor([float(self.requested)], device=accelerator.device)
        return bool(accelerator.reduce(flag, "sum").item() > 0)


def stopped_message(prog: str, output_dir: Path, step: int, total_steps: int) -> str:
    """What a stopped run says: where its state is, and the commands that continue it or make its drafter."""
    config = output_dir / "config.yaml"
    return (
        f"stopped at step {step} of {total_steps}; checkpoint-{step} saved in {output_dir}. "
        f"Continue the run: {prog} --config {config} --resume. "
        f"Or write the drafter of step {step} now, without training further: "
        f"{prog} --config {config} --resume train.max_steps={step}"
    )
