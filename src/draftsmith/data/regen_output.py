"""What `draftsmith data regenerate` writes, and how a rerun resumes from it: the one contract of the local
path and the endpoint path (scripts/data/regenerate_local.py, regenerate_endpoint.py).

- OUT: `messages` JSONL, one row per regenerated conversation, appended as it finishes, with its input `index`
  (and the input's `tools` and `category`, where it has them);
- OUT.failed.jsonl: the conversations that could not be regenerated for a reason of their own (no user turn,
  a prompt over the context, a request the server refused for its content), each with its `source` and
  `reason`; `--retry-failed` asks for them again;
- OUT.meta.json: the run's settings, written (atomically) before any row, and every run's counts at its end.

A resume must ask the same target the same way about the same data (`CHECKED`): the sampling, the target's
identity (a local target's weights and tokenizer; a served model's id and `root`, and the weights' identity
where the server offers one) and the data's content (sha256 of the conversations read, so new content at the
same path is noticed). Any of them changed is refused in one line saying which, before anything is written.

Before anything touches OUT, it is checked to be a regenerate output (or absent): a file that is not (the input
data, another dataset) is refused, never repaired. Then a resume skips every index the two JSONL files hold,
after dropping the half-written last line a killed run leaves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from draftsmith.runtime.errors import Interrupted, UserError
from draftsmith.runtime.files import write_json, write_text

from .formats import Conversation

META_SUFFIX = ".meta.json"
FAILED_SUFFIX = ".failed.jsonl"
WRITER = "draftsmith data regenerate"  # the meta file's `written_by`: what makes OUT a regenerate output
CHECKED = ("sampling", "target", "data")  # a resume with others would mix two data distributions


class OutputRefused(UserError):
    """--out (or a file beside it) is not a regenerate output this run may continue."""


@dataclass(frozen=True)
class Sampling:
    """What was asked of the target; stored next to the output and checked on resume."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int


def data_record(source: str, data_format: str, convs: Sequence[Conversation]) -> dict[str, Any]:
    """The data as the meta file records it: where it was read from, and what it held (the number of
    conversations and the sha256 of their content, so a resume notices new content at the same path)."""
    return {"source": source, "format": data_format, "rows": len(convs), "sha256": content_sha256(convs)}


def content_sha256(convs: Sequence[Conversation]) -> str:
    """sha256 over the conversations' content (messages, text, id, tools, category; not where they were read
    from), in order."""
    h = hashlib.sha256()
    for conv in convs:
        row = [conv.messages, conv.text, conv.id, conv.tools, conv.category]
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def run_meta(
    sampling: Sampling, target: dict[str, Any], data: dict[str, Any], **recorded: Any
) -> dict[str, Any]:
    """The meta file's settings: the three a resume must match (`CHECKED`), then what is only `recorded`."""
    return {
        "written_by": WRITER,
        "sampling": asdict(sampling),
        "target": target,
        "data": data,  # see data_record
        **recorded,
    }


def new_counts(total: int, pending: int, keys: Sequence[str]) -> dict[str, Any]:
    """The counts of a run with `pending` of `total` conversations left to do (at the end, written + failed +
    skipped = input), then the path's own `keys` (answers, tokens ...), all from 0."""
    counts: dict[str, Any] = {"input": total, "written": 0, "failed": 0, "skipped": total - pending}
    return counts | dict.fromkeys(keys, 0)


def read_meta(path: Path) -> dict[str, Any] | None:
    """The meta file beside OUT (None when there is none), or one line saying why it cannot be one."""
    if not path.exists():
        return None
    what = f"{path} is not a regenerate meta file"
    advice = "pass a new --out (or delete OUT and its companions to start again)"
    if not path.is_file():
        raise OutputRefused(f"{what} (it is a directory); {advice}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        empty = path.stat().st_size == 0
        raise OutputRefused(
            f"{what} ({'it is empty' if empty else f'not valid JSON: {err}'}); {advice}"
        ) from None
    if not isinstance(meta, dict) or not all(k in meta for k in CHECKED):
        raise OutputRefused(f"{what} (no {', '.join(CHECKED)} settings in it); {advice}")
    return meta


def changed_setting(old: dict[str, Any], new: dict[str, Any], convs: Sequence[Conversation]) -> str | None:
    """What differs between a run's settings `new` (reading `convs`) and the file's `old`, in words, or None
    (the same: it may resume)."""
    older = "written_by" not in old  # an earlier version recorded fewer keys: those it has must match
    for key in ("sampling", "target"):
        before, after = old.get(key) or {}, new[key]
        keys = [k for k in after if k in before or not older]
        diff = [f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in keys if before.get(k) != after.get(k)]
        diff += [f"{k} {before[k]!r} -> none" for k in before if k not in after]
        if diff:
            return f"the {'served model' if 'served_model' in after else key} differs ({'; '.join(diff)})"
    return data_changed(old.get("data") or {}, new["data"], convs)


def data_changed(old: dict[str, Any], new: dict[str, Any], convs: Sequence[Conversation]) -> str | None:
    """Why the data read now is not the data the file was written from, or None. The data may have grown
    (--max-samples raised): the first `rows` conversations must then hash as before."""
    if "sha256" not in old:  # written before content was recorded: only the path can be compared
        return None if old.get("source") == new["source"] else f"the data differs ({old.get('source')!r})"
    if new["rows"] < old["rows"]:
        return (
            f"the data has {new['rows']} conversations but this output was started with {old['rows']} "
            f"(--max-samples lowered, or the data shrank): pass --max-samples {old['rows']} or more"
        )
    now = new["sha256"] if new["rows"] == old["rows"] else content_sha256(convs[: old["rows"]])
    if now != old["sha256"]:
        return (
            f"the data's content changed: its first {old['rows']} conversations are not the ones this output "
            f"answers (data {new['source']!r}, sha256 {old['sha256'][:12]} -> {now[:12]})"
        )
    return None


def read_done(out: Path) -> tuple[set[int], int]:
    """Input indices already in `out`, and the length of its complete lines (a killed run leaves a half-written
    last line after them). Nothing is changed here: a file that is not a regenerate output is refused first."""
    done: set[int] = set()
    if not out.is_file():
        return done, 0
    raw = out.read_bytes()
    good = raw[: raw.rfind(b"\n") + 1]
    for k, line in enumerate(good.splitlines()):
        try:
            row = json.loads(line)
            done.add(int(row["index"]))
        except (ValueError, KeyError, TypeError) as err:
            raise OutputRefused(
                f"{out}:{k + 1} is not a regenerate row ({type(err).__name__}: {err}); nothing was changed: pass "
                "a new --out"
            ) from None
    return done, len(good)


@dataclass
class RowWriter:
    """Appends finished conversations to OUT and failures to OUT.failed.jsonl (open files, flushed on ask).
    A write that fails (a full disk) names the file it was writing."""

    rows: TextIO
    failures: TextIO

    def row(self, index: int, conv: Conversation, messages: list[dict[str, Any]]) -> None:
        """Conversation `index` with its new `messages` (and the input's tools and category)."""
        record: dict[str, Any] = {"index": index, "messages": messages}
        if conv.tools:
            record["tools"] = conv.tools
        if conv.category:
            record["category"] = conv.category
        self._write(self.rows, json.dumps(record, ensure_ascii=False) + "\n")

    def failure(self, index: int, conv: Conversation, reason: str) -> None:
        """Conversation `index` could not be regenerated, and why."""
        self._write(
            self.failures, json.dumps({"index": index, "source": conv.source, "reason": reason}) + "\n"
        )

    def flush(self) -> None:
        """Both files to the OS, so a killed run loses nothing written so far."""
        for f in (self.rows, self.failures):
            with _naming(f):
                f.flush()

    @staticmethod
    def _write(f: TextIO, line: str) -> None:
        with _naming(f):
            f.write(line)


@contextlib.contextmanager
def _naming(f: TextIO) -> Iterator[None]:
    """An OSError from writing to `f` (whose own error names no file) names it, so a full disk is reported on
    the filesystem that filled."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, f.name) from None


@contextlib.contextmanager
def _naming_close(f: TextIO) -> Iterator[TextIO]:
    try:
        yield f
    finally:
        with _naming(f):
            f.close()


class RegenOutput:
    """OUT and its two companions for one run with the settings `meta` (see `run_meta`)."""

    def __init__(self, out: Path, meta: dict[str, Any], convs: Sequence[Conversation]) -> None:
        self.out = out
        self.meta = meta
        self.convs = convs
        self.meta_path = out.with_name(out.name + META_SUFFIX)
        self.failed_path = out.with_name(out.name + FAILED_SUFFIX)
        self.rows_before = 0  # rows OUT held when this run began (set by `resume`)

    def check(self, data: str) -> None:
        """Refuse an OUT that is not this command's to write: a directory, the input `data` file itself, or an
        existing file with no regenerate meta file beside it. Touches nothing."""
        check_out_path(self.out, data)
        if self.out.exists() and read_meta(self.meta_path) is None:
            raise OutputRefused(
                f"--out {self.out} exists and is not a regenerate output (no {self.meta_path.name} beside it); "
                "nothing was changed: pass a new --out"
            )

    def resume(self, retry_failed: bool = False) -> set[int]:
        """Refuse another run's settings, then record these before any row (so that a resumed run is checked),
        cut a half-written last line, and return the input indices to skip: those OUT holds, and those
        OUT.failed.jsonl holds unless `retry_failed` (then its records are cleared: they are asked again)."""
        old = read_meta(self.meta_path)
        if old is not None:
            changed = changed_setting(old, self.meta, self.convs)
            if changed:
                raise OutputRefused(
                    f"{self.out} was written with other settings: {changed}; resume with the same ones, or pass a "
                    "new --out"
                )
            self.meta["runs"] = list(old.get("runs") or [])
        done, good = read_done(self.out)
        failed, failed_good = read_done(self.failed_path)
        self.rows_before = len(done)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.meta_path, self.meta)
        _cut(self.out, good)
        _cut(self.failed_path, failed_good)
        if retry_failed and failed:
            write_text(self.failed_path, "")
            return done
        return done | failed

    @contextlib.contextmanager
    def appending(self) -> Iterator[RowWriter]:
        """OUT and OUT.failed.jsonl open for appending: a rerun continues them. Closing (the last flush) names
        the file it failed on, as a write does."""
        with _naming_close(self.out.open("a")) as rows, _naming_close(self.failed_path.open("a")) as failures:
            yield RowWriter(rows, failures)

    def finish(self, counts: dict[str, Any], **outcome: Any) -> None:
        """Store this run's `counts` and `outcome` in the meta file: as the latest, and in `runs` after the
        earlier runs' (a resumed output keeps every run's record). A run the user stopped (`counts`
        "interrupted") then ends in `Interrupted`, saying how many rows OUT keeps."""
        outcome = {"counts": counts, **outcome}
        self.meta |= outcome
        self.meta["runs"] = [*self.meta.get("runs", []), outcome]
        write_json(self.meta_path, self.meta)
        if counts.get("interrupted"):
            kept = self.rows_before + counts["written"]
            raise Interrupted(f"interrupted: {kept} rows kept in {self.out}, rerun to continue")


def check_out_path(out: Path, data: str) -> None:
    """--out must name a file (not a directory) that is not the input `data` (when that is a local file)."""
    if out.is_dir():
        raise OutputRefused(
            f"--out {out} is a directory; name the .jsonl file to write, e.g. {out}/regenerated.jsonl"
        )
    source = Path(data).expanduser()
    if source.is_file() and out.exists() and source.samefile(out):
        raise OutputRefused(f"--out {out} is the input --data file; name a new file for the output")


def _cut(path: Path, length: int) -> None:
    """Drop what follows the complete lines of `path` (the half-written line of a killed run)."""
    if path.is_file() and path.stat().st_size != length:
        os.truncate(path, length)  # in place: the complete rows before it are never rewritten
