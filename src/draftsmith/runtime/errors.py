"""Turn user mistakes and environment faults into one-line errors at the command line instead of deep
tracebacks."""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


class UserError(Exception):
    """A problem the user can fix (a busy directory, a damaged file, a missing flag): printed as one line."""


class Interrupted(UserError):
    """The user stopped the run (Ctrl-C); the message says what was kept. Printed as one line, exit 130."""

    exit_status = 130


def _existing_parent(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (an existing path)."""
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def describe_os_error(err: OSError) -> str | None:
    """One line for the filesystem faults a user can act on (full disk, quota, read-only or not writable),
    naming the path; None for any other OSError."""
    where = Path(str(err.filename)) if err.filename else None
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        if where is None:
            return "no space left on the device being written to; free some space or write elsewhere"
        mount = mount_point(_existing_parent(where))
        free = format_bytes(shutil.disk_usage(mount).free)
        quota = " (or your quota on it)" if err.errno == errno.EDQUOT else ""
        return (
            f"no space left on the filesystem mounted at {mount}{quota}, {free} free, while writing {where}; "
            "free some space there or write elsewhere"
        )
    if err.errno == errno.EROFS:
        return f"{where or 'the output'} is on a read-only filesystem; choose a writable directory"
    if err.errno in (errno.EACCES, errno.EPERM) and where is not None:
        return f"permission denied: {where}; choose a directory you can write to (or fix its permissions)"
    return None


_WRAPPED = {  # how libraries that write files report these faults in their own exception types
    errno.ENOSPC: ("No space left on device", "os error 28", "unexpected pos"),
    errno.EROFS: ("Read-only file system", "os error 30"),
}


def describe_wrapped_disk_error(err: BaseException) -> str | None:
    """One line for a full or read-only disk reported by safetensors (`os error 28`), torch's zip writer
    (`unexpected pos`: a write came back short) or another library's wrapper; None otherwise."""
    text = str(err)
    for code, needles in _WRAPPED.items():
        if any(n in text for n in needles):
            return describe_os_error(OSError(code, os.strerror(code), _path_in(text)))
    return None


def _path_in(text: str) -> str | None:
    for word in text.replace("'", " ").replace('"', " ").split():
        if word.startswith("/"):
            return word.rstrip(":,.)")
    return None


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)`; a ValueError / FileNotFoundError / UserError (how draftsmith reports bad input) or a
    full, read-only or unwritable disk is printed as `error: <message>` with exit status 1; Ctrl-C as one line
    (`Interrupted`'s message, which says what was kept), exit status 130. Set DRAFTSMITH_DEBUG=1 to get the
    traceback instead."""
    try:
        return int(main(argv) or 0)
    except (KeyboardInterrupt, Interrupted) as err:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        _close_progress_bars()
        said = str(err) if isinstance(err, Interrupted) else "interrupted"
        if said:  # the other ranks of a stopped multi-process run leave it to the main process
            print(said, file=sys.stderr)
        return Interrupted.exit_status
    except Exception as err:
        message = one_line(err)
        if message is None or os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        _close_progress_bars()  # a bar left mid-line would swallow the start of the error line
        print(f"error: {message}", file=sys.stderr)
        print("(set DRAFTSMITH_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _close_progress_bars() -> None:
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def one_line(err: Exception) -> str | None:
    """The message to print for `err`, or None for a bug (which keeps its traceback)."""
    if isinstance(err, (ValueError, FileNotFoundError, UserError)):
        return str(err)
    return disk_fault(err)


def disk_fault(err: BaseException) -> str | None:
    """One line for a full, read-only or unwritable disk, however the writer reported it; None otherwise."""
    if isinstance(err, OSError):
        return describe_os_error(err)
    return describe_wrapped_disk_error(err)


class DiskFull(UserError):
    """Not enough free space for what is about to be written (checked before writing it)."""


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # unreachable: the loop returns at GB


def require_space(
    directory: Path, needed: int, what: str, advice: str = "free some space or write elsewhere"
) -> None:
    """Refuse to start writing `what` (about `needed` bytes) into `directory` when its filesystem has less free.

    Raises:
        DiskFull: "no space left on <dir>: N free, <what> needs ~M".
    """
    free = shutil.disk_usage(_existing_parent(Path(directory))).free
    if free < needed:
        raise DiskFull(
            f"no space left on {directory}: {format_bytes(free)} free, {what} needs ~{format_bytes(needed)}; {advice}"
        )
