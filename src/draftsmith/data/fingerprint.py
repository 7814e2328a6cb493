"""What a data source is, by content: the sha256 of a local file or folder a recipe or an evaluation names.

What is hashed, per source (keyed by the source as written):
- a file: its bytes;
- a directory (`datasets.save_to_disk`, or `hf:DIR` naming a local folder of data files): every file under it,
  by relative path and sha256 (the whole folder is read once, as a file of that size would be);
- the built-in corpora (`stdlib[:split]`, `prompts[:split]`) and Hub datasets (`hf:owner/name`): not hashed.
  The built-ins ship with draftsmith; a Hub dataset would have to be downloaded to be hashed, and its name and
  the Hub's revision, not bytes on this disk, say what it is;
- a path that does not exist: not hashed (reading it fails with its own error).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from draftsmith.runtime.files import sha256_file

_BUILT_IN = re.compile(r"^(stdlib|prompts)(:[A-Za-z0-9_]+)?$")


def _local_path(source: str) -> Path | None:
    """The file or folder on this disk that `source` reads, or None (built-in, Hub, missing)."""
    if _BUILT_IN.match(source):
        return None
    if source.startswith("hf:"):
        folder = Path(source[len("hf:") :].partition(":")[0])
        return folder if folder.is_dir() else None
    path = Path(source)
    return path if path.exists() else None


def directory_sha256(folder: Path) -> str:
    """One sha256 over every file under `folder`: its relative path and its own sha256, in path order."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(folder).as_posix()}\t{sha256_file(path)}\n".encode())
    return h.hexdigest()


def source_hashes(sources: Sequence[str]) -> dict[str, str]:
    """`{source: sha256}` of each source that is a local file or folder (see the module docstring)."""
    out: dict[str, str] = {}
    for source in sources:
        path = _local_path(source)
        if path is not None and source not in out:
            out[source] = directory_sha256(path) if path.is_dir() else sha256_file(path)
    return out
