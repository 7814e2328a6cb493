"""What a stage's data is, by content: the sha256 of every local data file a recipe names, recorded by the
feature cache (settings.json, index.json), by every training checkpoint (trainer_state.json) and by final/
(config.json `training.data_sha256`), and compared before a stage reuses what it made from them, so a data
file edited in place is noticed instead of trained on as if it were the old one.

What is hashed, per source of `data.train` and `data.eval`: data/fingerprint.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from draftsmith.data.fingerprint import directory_sha256, source_hashes

from .data import DataConfig

__all__ = ["CONTENT_KEY", "content_change", "data_hashes", "directory_sha256", "source_hashes"]

CONTENT_KEY = "data_sha256"  # the record's key in settings.json, index.json, trainer_state.json, final/


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
