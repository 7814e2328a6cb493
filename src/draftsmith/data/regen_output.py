"""What `draftsmith data regenerate` writes, and how a rerun resumes from it: the one contract of the local
path and the endpoint path (scripts/data/regenerate_local.py, regenerate_endpoint.py).

- OUT: `messages` JSONL, one row per regenerated conversation, appended as it finishes, with its input `index`
  (and the input's `tools` and `category`, where it has them);
- OUT.failed.jsonl: the conversations that could not be regenerated, each with its `source` and `reason`;
- OUT.meta.json: the run's settings, written before any row, then with the counts at the end. A resume must
  have the same sampling, target and data (`CHECKED`); the rest is recorded only.

A resume skips every index the two JSONL files hold, after dropping the half-written last line a killed run
leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from draftsmith.runtime.files import write_json

from .formats import Conversation

META_SUFFIX = ".meta.json"
FAILED_SUFFIX = ".failed.jsonl"
CHECKED = ("sampling", "target", "data")  # a resume with others would mix two data distributions


@dataclass(frozen=True)
class Sampling:
    """What was asked of the target; stored next to the output and checked on resume."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int


def run_meta(
    sampling: Sampling, target: dict[str, Any], data: str, data_format: str, **recorded: Any
) -> dict[str, Any]:
    """The meta file's settings: the three a resume must match (`CHECKED`), then what is only `recorded`."""
    return {
        "sampling": asdict(sampling),
        "target": target,
        "data": {"source": data, "format": data_format},  # --max-samples may grow on resume
        **recorded,
    }


def new_counts(total: int, pending: int, keys: Sequence[str]) -> dict[str, Any]:
    """The counts of a run with `pending` of `total` conversations left to do (at the end, written + failed +
    skipped = input), then the path's own `keys` (answers, tokens ...), all from 0."""
    counts: dict[str, Any] = {"input": total, "written": 0, "failed": 0, "skipped": total - pending}
    return counts | dict.fromkeys(keys, 0)


def read_done(out: Path) -> set[int]:
    """Input indices already in `out` (dropping a half-written last line, which a killed run leaves)."""
    done: set[int] = set()
    if not out.is_file():
        return done
    raw = out.read_bytes()
    good = raw[: raw.rfind(b"\n") + 1]
    if len(good) != len(raw):
        os.truncate(out, len(good))  # cut in place: the complete rows before it are never rewritten
    for k, line in enumerate(good.decode().splitlines()):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{out}:{k + 1} is not a regenerate row ({err}); pass a new --out or delete the file"
            ) from None
    return done


def check_meta(path: Path, meta: dict[str, Any]) -> None:
    """Refuse to resume a file written with other settings (it would mix two data distributions)."""
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for key in CHECKED:
        if old.get(key) != meta[key]:
            raise ValueError(
                f"{path} was written with {key} {old.get(key)} but this run has {meta[key]}; resume with the "
                "same settings, or pass a new --out"
            )


@dataclass
class RowWriter:
    """Appends finished conversations to OUT and failures to OUT.failed.jsonl (open files, flushed on ask)."""

    rows: TextIO
    failures: TextIO

    def row(self, index: int, conv: Conversation, messages: list[dict[str, Any]]) -> None:
        """Conversation `index` with its new `messages` (and the input's tools and category)."""
        record: dict[str, Any] = {"index": index, "messages": messages}
        if conv.tools:
            record["tools"] = conv.tools
        if conv.category:
            record["category"] = conv.category
        self.rows.write(json.dumps(record, ensure_ascii=False) + "\n")

    def failure(self, index: int, conv: Conversation, reason: str) -> None:
        """Conversation `index` could not be regenerated, and why."""
        self.failures.write(json.dumps({"index": index, "source": conv.source, "reason": reason}) + "\n")

    def flush(self) -> None:
        """Both files to the OS, so a killed run loses nothing written so far."""
        self.rows.flush()
        self.failures.flush()


class RegenOutput:
    """OUT and its two companions for one run with the settings `meta` (see `run_meta`)."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.meta = meta
        self.meta_path = out.with_name(out.name + META_SUFFIX)
        self.failed_path = out.with_name(out.name + FAILED_SUFFIX)

    def resume(self) -> set[int]:
        """Refuse settings other than the file's, record these before any row (so that a resumed run is
        checked), and return the input indices OUT and OUT.failed.jsonl already hold."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        check_meta(self.meta_path, self.meta)
        write_json(self.meta_path, self.meta)
        return read_done(self.out) | read_done(self.failed_path)

    @contextlib.contextmanager
    def appending(self) -> Iterator[RowWriter]:
        """OUT and OUT.failed.jsonl open for appending: a rerun continues them."""
        with self.out.open("a") as rows, self.failed_path.open("a") as failures:
            yield RowWriter(rows, failures)

    def finish(self, **outcome: Any) -> None:
        """Store the run's `outcome` (its counts, ...) in the meta file, after the settings."""
        self.meta |= outcome
        write_json(self.meta_path, self.meta)
