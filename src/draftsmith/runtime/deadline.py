"""A deadline for a block of work that stops the way Ctrl-C does.

draftsmith's long commands already stop well on Ctrl-C: training finishes its step and saves a checkpoint,
`data regenerate` keeps every finished batch, the cache keeps its complete shards. `Deadline(seconds)` reuses
those paths instead of adding a clock to each of them: when the time is up and the block is still running, it
delivers SIGINT to the main thread (`_thread.interrupt_main`), so whatever handles Ctrl-C there handles it.
"""

from __future__ import annotations

import _thread
import signal
import threading


class Deadline:
    """`with Deadline(seconds) as d:` -- SIGINT for the main thread after `seconds` unless the block ended first
    (None: no deadline). `d.fired` says whether it was sent, so the caller can tell a deadline from a user's
    Ctrl-C."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.fired = False
        self._active = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Deadline:
        self._active = True
        if self.seconds is not None:
            self._timer = threading.Timer(max(0.0, self.seconds), self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _fire(self) -> None:
        with self._lock:  # never after __exit__ has marked the block ended
            if self._active:
                self.fired = True
                _thread.interrupt_main(signal.SIGINT)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active = False
        if self._timer is not None:
            self._timer.cancel()
