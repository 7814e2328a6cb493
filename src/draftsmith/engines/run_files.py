"""What an `engine-eval` run writes and keeps: every output checked before anything runs, and vLLM's logs copied
out of a temporary working directory when a run fails (engine_eval.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from draftsmith.runtime.display import pyplot
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import check_output_file, user_cache

from .settings import EngineEvalArgs

# Under draftsmith's cache: the vLLM logs of a failed run that had no --work-dir
KEPT_LOGS = "engine-eval-logs"


def check_outputs(args: EngineEvalArgs) -> None:
    """Everything the end of the run writes, checked before anything loads: the --report and --plot files,
    matplotlib for --plot, the --work-dir and --plain-cache directories."""
    if args.report:
        check_output_file(Path(args.report), "--report")
    if args.plot:
        check_output_file(Path(args.plot), "--plot")
        pyplot()  # one line naming the install when matplotlib is missing
    for flag, folder in (("--work-dir", args.work_dir), ("--plain-cache", args.plain_cache)):
        if folder:
            check_output_dir(Path(folder), flag)


def check_output_dir(folder: Path, flag: str) -> None:
    """Refuse, before any work, a directory that could not be written: it is a file, or its nearest existing
    parent is a file or not writable. One line naming `flag`."""
    folder = folder.expanduser()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    if existing == folder and not folder.is_dir():
        raise UserError(f"{flag} {folder} is a file; name a directory")
    if not existing.is_dir():
        raise UserError(f"{flag} {folder}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {folder}: {existing} is not writable; choose a directory you can write to")


def keep_logs(work: Path) -> Path | None:
    """Copies of the vLLM logs in `work` (a temporary directory about to be deleted) in a lasting folder
    under draftsmith's cache; None when there are none or they cannot be copied."""
    logs = sorted(work.glob("*.log"))
    if not logs:
        return None
    kept = user_cache() / KEPT_LOGS / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        kept.mkdir(parents=True, exist_ok=True)
        for log in logs:
            shutil.copy2(log, kept / log.name)
    except OSError:
        return None
    return kept
