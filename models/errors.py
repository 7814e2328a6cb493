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


def _existing_parent(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def describe_os_error(err: OSError) -> str | None:
    """One line for the filesystem faults a user can act on (full disk, quota, read-only or not writable),
    naming the path; None for any other OSError."""
    where = Path(str(err.filename)) if err.filename else None
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        place = _existing_parent(where) if where else Path.cwd()
        free = shutil.disk_usage(place).free / 1e9
        return (f"no space left on {place} ({free:.1f} GB free) while writing {where or 'a file'}; free some space "
                "or write elsewhere. Files written before this one are intact.")  # fmt: skip
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
    full, read-only or unwritable disk is printed as `error: <message>` with exit status 1. Set
    DRAFTSMITH_DEBUG=1 to get the traceback instead."""
    try:
        return int(main(argv) or 0)
    except Exception as err:
        message = one_line(err)
        if message is None or os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"error: {message}", file=sys.stderr)
        print("(set DRAFTSMITH_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def one_line(err: Exception) -> str | None:
    """The message to print for `err`, or None for a bug (which keeps its traceback)."""
    if isinstance(err, (ValueError, FileNotFoundError, UserError)):
        return str(err)
    if isinstance(err, OSError):
        return describe_os_error(err)
    return describe_wrapped_disk_error(err)
