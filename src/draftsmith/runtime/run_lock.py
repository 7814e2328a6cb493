"""One writer per directory: a lock file naming its holder, taken by training, caching and export.

Two trainings started into the same `output_dir`, or a `--resume` while the run is still going, would both
write `metrics.jsonl`, checkpoints and `final/` and both exit 0. `RunLock` creates `<dir>/.draftsmith.lock`
with `O_CREAT | O_EXCL` (atomic on local and NFSv3+ filesystems), holding the holder's pid, host, start time
and command. A second writer is refused with one line naming the holder. A lock whose holder is gone (same
host, pid no longer running) is stale: it is taken over with a notice. A lock from another host cannot be
checked and is never taken over: the message says how to remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.runtime.errors import UserError

LOCK_NAME = ".draftsmith.lock"


class DirectoryBusy(UserError):
    """Another live process holds the directory's lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv)[:500],
    }


def _describe(info: dict[str, Any]) -> str:
    text = f"pid {info.get('pid')} on {info.get('host')}"
    if info.get("started"):
        text += f" since {info['started']}"
    if info.get("command"):
        text += f" ({str(info['command'])[:120]})"
    return text


UNREADABLE_WAIT_S = 2.0  # how long a lock file may stay empty or partial while its writer fills it


class RunLock:
    """`with RunLock(directory, "training"):` holds `<directory>/.draftsmith.lock` for the block (`name`: another
    lock file in `directory`, e.g. one per export beside the export's directory, which must stay clean).

    Raises:
        DirectoryBusy: a live process (or one on another host) holds the lock.
    """

    def __init__(self, directory: str | Path, purpose: str, name: str = LOCK_NAME):
        self.directory = Path(directory)
        self.purpose = purpose
        self.path = self.directory / name
        self.notice: str | None = None
        self._held = False

    def acquire(self) -> RunLock:
        if self.directory.exists() and not self.directory.is_dir():
            raise UserError(
                f"{self.directory} is a file, not a directory; choose a directory for the {self.purpose} output"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        info = {**_holder(), "purpose": self.purpose}
        for _ in range(3):  # a stale lock removed between our attempts is retried
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(info) + "\n")
            self._held = True
            return self
        raise DirectoryBusy(
            f"could not lock {self.directory}: {self.path} keeps reappearing; another writer is starting"
        )

    def _read_holder(self) -> dict[str, Any] | None:
        """The lock's holder; None when the file is gone. A writer creates the file (O_EXCL) before it writes its
        line, so an empty or partial file is read again for up to `UNREADABLE_WAIT_S` before it counts as
        unreadable (`{}`): two runs started at once saw that window (tests/recipes/test_mid_run_faults.py)."""
        deadline = time.monotonic() + UNREADABLE_WAIT_S
        while True:
            try:
                holder = json.loads(self.path.read_text())
                if isinstance(holder, dict):
                    return holder
            except FileNotFoundError:
                return None
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.05)

    def _take_over_if_stale(self) -> None:
        holder = self._read_holder()
        if holder is None:
            return  # released meanwhile: try again
        pid, host = holder.get("pid"), holder.get("host")
        if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
            self.notice = f"note: took over the stale lock of {_describe(holder)}, which is no longer running"
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        if not holder:
            raise DirectoryBusy(
                f"{self.directory} holds an unreadable lock file {self.path}; if no draftsmith process writes "
                "there, delete that file and retry"
            )
        where = (
            "" if host == socket.gethostname() else f" (on another host: if it is gone, delete {self.path})"
        )
        raise DirectoryBusy(
            f"{self.directory} is in use by {holder.get('purpose', 'another writer')}, {_describe(holder)}{where}; "
            "wait for it to finish or choose another directory"
        )

    def release(self) -> None:
        """Remove the lock file if it is still this process's."""
        if not self._held:
            return
        self._held = False
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def main_process_lock(directory: str | Path, purpose: str, is_main: bool) -> Iterator[None]:
    """Hold `directory`'s lock for the block on the main process of a launch (the other ranks write only what
    the main one coordinates); prints the notice of a stale lock taken over."""
    if not is_main:
        yield
        return
    with RunLock(directory, purpose) as lock:
        if lock.notice:
            print(lock.notice)
        yield
