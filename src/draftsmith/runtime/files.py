"""Files written whole or not at all, and checked when read back: sha256 records, JSON that names where it is
broken, directories replaced by a rename. Every stage that writes a run, a checkpoint, a cache or an export uses
these, so they live on the ground floor."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import UserError


def user_cache() -> Path:
    """draftsmith's own cache: `$DRAFTSMITH_CACHE`, or `~/.cache/draftsmith` when unset (built targets, the
    standard-library corpus)."""
    env = os.environ.get("DRAFTSMITH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "draftsmith"


class DamagedFile(UserError):
    """A file is unreadable, or differs from the sha256 recorded when it was written."""


def sha256_file(path: Path, block: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def record_hashes(directory: Path, names: list[str]) -> dict[str, str]:
    """`{name: sha256}` of files in `directory`, for a config that later `verify_hashes` checks."""
    return {name: sha256_file(directory / name) for name in names}


def verify_hashes(directory: Path, recorded: dict[str, str] | None, where: str) -> None:
    """Check every file against the sha256 recorded in `where` (a checkpoint written before hashes were
    recorded has none: nothing to check).

    Raises:
        DamagedFile: a file is missing or differs (one flipped byte is enough).
    """
    for name, digest in (recorded or {}).items():
        path = directory / name
        if not path.is_file():
            raise DamagedFile(f"{path} is missing (listed in {where})")
        if sha256_file(path) != digest:
            raise DamagedFile(
                f"{path} does not match the sha256 recorded in {where}: the file was changed or damaged after it "
                "was written; restore it, or export / train it again"
            )


def check_output_file(path: Path, flag: str) -> None:
    """Refuse, before any work, an output file that could not be written at the end: `path` is a directory,
    its parent is a file, or its nearest existing directory is not writable. One line naming `flag`."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory; name the file to write")
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {parent} is not writable; choose a directory you can write to")


def read_json(path: Path) -> Any:
    """A JSON file, or one line naming the file, line and column where it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DamagedFile(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None


def write_json(path: Path, data: Any, *, sort_keys: bool = False, ensure_ascii: bool = True) -> None:
    """`data` as indented JSON with a final newline, written atomically (`atomic_file`); `read_json` reads it."""
    write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + "\n")


def write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) written atomically (`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """`with atomic_file(out) as tmp:` write the file `tmp` with any writer (text, safetensors, JSON lines); on
    success it is flushed to disk, made readable by all (0644) and renamed to `out`, so readers see the old
    or the new file, never half of one. On any failure `tmp` is removed and `out` is untouched. Missing
    parent directories are created. The one atomic file writer: every stage writes files through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; what draftsmith writes is meant to be shared and read
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk gets its space back
        raise


def draftsmith_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("draftsmith")
    except PackageNotFoundError:
        return "0.0.0+source"


@contextlib.contextmanager
def atomic_dir(final_dir: Path) -> Iterator[Path]:
    """`with atomic_dir(out) as tmp:` write into `tmp` (a fresh sibling of `out`; a leftover from a killed
    write is cleared); on success `tmp` replaces `out` by a rename, so readers see the old or the new
    directory, never half of one. On any failure (a full disk, a bug) `tmp` is removed and `out` is untouched."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(final_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its space back
        raise
    commit_dir(tmp, final_dir)


def commit_dir(tmp: Path, final_dir: Path) -> None:
    """Replace `final_dir` by `tmp` (a rename, so readers see the old or the new directory, never half)."""
    if final_dir.exists():
        old = final_dir.with_name(final_dir.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final_dir)


def file_manifest(directory: Path, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """`{relative path: sha256}` of every file under `directory` but `leave_out`: what a writer records of the
    files it wrote, so that `check_replaceable` can tell them from a user's."""
    return {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).as_posix() not in leave_out
    }


def check_replaceable(directory: Path, manifest_name: str, flag: str, what: str) -> None:
    """Refuse, before any work, to replace `directory` unless it is absent, empty, or holds only the files
    draftsmith wrote there: each listed in its manifest (`manifest_name`'s `files`, `file_manifest`) with the
    sha256 it was written with (a listed file since removed is fine). A user's file added to an output
    directory, or one edited in place, is never deleted by the next write.

    Raises:
        UserError: naming the directory and the first file that is not draftsmith's as written.
    """
    directory = Path(directory).expanduser()
    if not directory.exists():
        return
    if not directory.is_dir():
        raise UserError(f"{flag} {directory} is a file, not a directory; choose a new or empty directory")
    found = [p for p in sorted(directory.rglob("*")) if p.is_file()]
    if not found:
        return
    manifest = directory / manifest_name
    record = read_json(manifest) if manifest.is_file() else None
    listed = record.get("files") if isinstance(record, dict) else None
    if not isinstance(listed, dict):
        raise UserError(
            f"{directory} exists and is not {what} (no {manifest_name} listing its files); choose an empty or "
            f"new {flag} directory, or remove this one yourself"
        )
    for path in found:
        name = path.relative_to(directory).as_posix()
        if name == manifest_name:
            continue
        if name not in listed:
            raise UserError(
                f"{flag} {directory} holds {name}, which draftsmith did not write there and which replacing the "
                f"directory would delete; move it out, or choose another {flag} directory"
            )
        if sha256_file(path) != listed[name]:
            raise UserError(
                f"{flag} {directory}: {name} was changed after draftsmith wrote it, and replacing the directory "
                f"would lose the change; move it out, or choose another {flag} directory"
            )
