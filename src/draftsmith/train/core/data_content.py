"""What a stage's data is, by content: the sha256 of every local data file a recipe names, recorded by the
feature cache (settings.json, index.json), by every training checkpoint (trainer_state.json) and by final/
(config.json `training.data_sha256`), and compared before a stage reuses what it made from them, so a data
file edited in place is noticed instead of trained on as if it were the old one.

What is hashed, per source of `data.train` and `data.eval` (keyed by the source as the recipe writes it):
- a file: its bytes;
- a directory (`datasets.save_to_disk`, or `hf:DIR` naming a local folder of data files): every file under it,
  by relative path and sha256 (the whole folder is read once per stage start, as a file of that size would be);
- the built-in corpora (`stdlib[:split]`, `prompts[:split]`) and Hub datasets (`hf:owner/name`): not hashed.
  The built-ins ship with draftsmith; a Hub dataset would have to be downloaded to be hashed, and its name and
  the Hub's revision, not bytes on this disk, say what it is;
- a path that does not exist: not hashed (reading it fails with its own error).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from draftsmith.runtime.files import sha256_file

from .data import DataConfig

CONTENT_KEY = "data_sha256"  # the record's key in settings.json, index.json, trainer_state.json, final/
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


def data_hashes(data: DataConfig) -> dict[str, str]:
    """`source_hashes` of a recipe's data section (its `train` and `eval` sources)."""
    return source_hashes([*data.train, *data.eval])


def content_change(
    recorded: Mapping[str, str] | None, now: Mapping[str, str], every_file: bool = False
) -> str | None:
    """What differs between the data recorded earlier and the data now, as a phrase naming the file; None when
    nothing does.

    A source recorded under the same name must have the same sha256; a source recorded under no name must hold
    the content of one that was (the same file moved or copied). With `every_file`, each recorded file's
    content must also be among the data now (a run resumed on the same data; a cache's recipe may name fewer
    files, or none: a cache is trained from its own samples). A record written before draftsmith recorded
    content (`recorded` None) cannot be compared: None.
    """
    if recorded is None:
        return None
    for source, digest in now.items():
        before = recorded.get(source)
        if before is not None and before != digest:
            return f"{source} changed (sha256 {before[:12]} then, {digest[:12]} now)"
        if before is None and digest not in recorded.values():
            built_from = ", ".join(recorded) or "no local file: built-in or Hub data"
            return f"{source} is not a file it was made from (made from: {built_from})"
    gone = [source for source, digest in recorded.items() if digest not in now.values()]
    if every_file and gone:
        return f"{gone[0]} is no longer among the data (now: {', '.join(now) or 'no local file'})"
    return None
