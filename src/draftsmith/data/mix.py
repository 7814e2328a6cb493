"""One training file from many sources: read, deduplicated, held-out prompts removed, shuffled, recorded.

`draftsmith data mix` (scripts/data/mix.py) writes what `mix_sources` returns. A long document becomes pieces of
at most `document_chars` characters cut at paragraph boundaries, each its own record (a training sample is
truncated at `data.max_len` tokens: an unsplit article would train on its first page only). The mix is shuffled once with
a seed, so any prefix of it (`data.max_samples=N`) is a smaller sample of the same mix: the points of a scaling
curve are prefixes of one file, not differently composed files.

Two records are duplicates when their text is equal after case and whitespace are normalized (a conversation:
every message's content and the tool schemas; a document: its text). A record is held out when its first user
turn (a document: its first 512 characters) equals, normalized the same way, the first user turn of a record
in an `exclude` source: an evaluation set never leaks into training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conversations import read_conversations
from .formats import Conversation

WRITER = "draftsmith data mix"  # the meta file's `written_by`
FORMAT_VERSION = 1
DOCUMENT_KEY_CHARS = 512  # a document's held-out key: its first characters
# Documents are cut into pieces of at most this many characters at paragraph (else line, else any) boundaries:
# about 500 tokens of English, so a piece fits a training sample instead of being truncated to its first one.
DOCUMENT_CHARS = 2000


@dataclass(frozen=True)
class SourceSpec:
    """A mix source: `SOURCE` or `SOURCE@N` (at most N records of it, in its own order, before deduplication)."""

    source: str
    limit: int | None = None

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        source, sep, limit = text.rpartition("@")
        if (
            sep
            and re.fullmatch(r"[-+]?\d+(\.\d*)?|[-+]?\.\d+|[-+]?(nan|inf)", limit.lower())
            and not limit.isdigit()
        ):
            raise ValueError(f"{text!r}: the record limit after '@' must be an integer >= 1, got {limit!r}")
        if not sep or not limit.isdigit():  # no '@N' suffix (an '@' inside a path or hf: name is kept)
            return cls(text)
        if int(limit) < 1:
            raise ValueError(f"{text!r}: the record limit after '@' must be an integer >= 1, got {limit!r}")
        return cls(source, int(limit))


@dataclass
class SourceCount:
    """What the mix took from one source."""

    source: str
    records: int = 0  # read (after the @N limit)
    kept: int = 0
    duplicates: int = 0  # equal to a record kept before (from this or an earlier source)
    held_out: int = 0  # their first user turn is an exclude source's prompt
    empty: int = 0  # no text at all
    tokens: int | None = None  # of the kept records' text, when a tokenizer counts them
    sha256: str | None = None  # of the source file, when it is a local file


@dataclass
class Mix:
    """The mixed records (JSON-ready, in their shuffled order) and what each source gave."""

    records: list[dict[str, Any]]
    counts: list[SourceCount]
    excluded_prompts: int
    document_chars: int  # distinct held-out prompts read from the exclude sources
    seed: int
    exclude: list[str] = field(default_factory=list)

    def meta(self) -> dict[str, Any]:
        """The record of the mix kept beside it: its sources with their counts and sha256, the seed, the exclude
        sources, and the totals."""
        return {
            "written_by": WRITER,
            "format_version": FORMAT_VERSION,
            "seed": self.seed,
            "records": len(self.records),
            "tokens": _total(c.tokens for c in self.counts),
            "sources": [vars(c) for c in self.counts],
            "document_chars": self.document_chars,
            "exclude": self.exclude,
            "excluded_prompts": self.excluded_prompts,
        }


def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def content_key(conv: Conversation) -> str:
    """The sha256 of a record's normalized text: equal for duplicates. Each text is normalized on its own and
    kept apart by its role, so neither a role nor a document can pass for the other."""
    if conv.text is not None:
        parts = ["document", normalized(conv.text)]
    else:
        parts = ["chat", *(f"{m['role']}:{normalized(str(m.get('content') or ''))}" for m in conv.messages)]
        if conv.tools:
            parts.append(json.dumps(conv.tools, sort_keys=True))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def prompt_key(conv: Conversation) -> str | None:
    """The normalized first user turn (a document: its first characters); None when the record has none."""
    if conv.text is not None:
        text = conv.text[:DOCUMENT_KEY_CHARS]
    else:
        text = next((str(m.get("content") or "") for m in conv.messages if m["role"] == "user"), "")
    key = normalized(text)
    return key or None


def to_record(conv: Conversation, label: str) -> dict[str, Any]:
    """A conversation as a JSON line that `read_conversations` reads back to the same conversation."""
    record: dict[str, Any] = {"text": conv.text} if conv.text is not None else {"messages": conv.messages}
    if conv.tools:
        record["tools"] = conv.tools
    if conv.category:
        record["category"] = conv.category
    record["source"] = label
    return record


def mix_sources(
    specs: Sequence[SourceSpec],
    exclude: Sequence[str] = (),
    seed: int = 0,
    count_tokens: Callable[[Conversation], int] | None = None,
    sha256: Callable[[str], str | None] = lambda source: None,
    document_chars: int = DOCUMENT_CHARS,
) -> Mix:
    """Read every source (in order), drop empty records, duplicates and held-out prompts, shuffle with `seed`.

    Args:
        specs: the sources and their record limits.
        exclude: sources of held-out prompts (evaluation sets) whose first user turns are kept out.
        count_tokens: the token count of a kept record's text (the meta records tokens per source).
        sha256: a source's file hash, or None (recorded in the meta).
        document_chars: the longest document piece (`split_document`); `kept` counts pieces.
    """
    held_out = {k for source in exclude for c in read_conversations(source) if (k := prompt_key(c))}
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    counts: list[SourceCount] = []
    for spec in specs:
        count = SourceCount(spec.source, sha256=sha256(spec.source), tokens=0 if count_tokens else None)
        for record in read_conversations(spec.source, limit=spec.limit):
            count.records += 1
            if not (record.text or any(m.get("content") for m in record.messages)):
                count.empty += 1
                continue
            if prompt_key(record) in held_out:
                count.held_out += 1
                continue
            for conv in split_document(record, document_chars):
                _add(conv, spec.source, count, seen, records, count_tokens)
        counts.append(count)
    random.Random(seed).shuffle(records)
    return Mix(records, counts, len(held_out), document_chars, seed, list(exclude))


def _add(
    conv: Conversation,
    label: str,
    count: SourceCount,
    seen: set[str],
    records: list[dict[str, Any]],
    count_tokens: Callable[[Conversation], int] | None,
) -> None:
    """Keep `conv` unless it duplicates a record kept before."""
    key = content_key(conv)
    if key in seen:
        count.duplicates += 1
        return
    seen.add(key)
    count.kept += 1
    if count_tokens is not None:
        count.tokens = (count.tokens or 0) + count_tokens(conv)
    records.append(to_record(conv, label))


def split_document(conv: Conversation, max_chars: int) -> list[Conversation]:
    """A document longer than `max_chars` as consecutive pieces of at most `max_chars` characters, cut at blank
    lines where it can, else at line ends, else anywhere; a conversation (or a short document) as itself. Only
    the separators at the cuts are lost: the pieces hold every other character, in order."""
    if conv.text is None or len(conv.text) <= max_chars:
        return [conv]
    pieces = _pieces(conv.text, max_chars, ("\n\n", "\n", ""))
    return [dataclasses.replace(conv, text=p) for p in pieces if p.strip()]


def _pieces(text: str, max_chars: int, separators: tuple[str, ...]) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    sep, finer = separators[0], separators[1:]
    if not sep:
        return [text[i : i + max_chars] for i in range(0, len(text), max_chars)]
    out: list[str] = []
    current = ""
    for part in text.split(sep):
        candidate = f"{current}{sep}{part}" if current else part
        if len(candidate) <= max_chars:
            current = candidate
            continue
        if current:
            out.append(current)
        if len(part) <= max_chars:
            current = part
        else:
            out += _pieces(part, max_chars, finer)
            current = ""
    if current:
        out.append(current)
    return out


def local_sha256(source: str) -> str | None:
    """The sha256 of a local source file (None for `hf:`, built-in and directory sources)."""
    from draftsmith.runtime.files import sha256_file

    path = Path(source).expanduser()
    return sha256_file(path) if path.is_file() else None


def _total(values: Any) -> int | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)
