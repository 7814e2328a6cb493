"""Read chat data from files, saved datasets, the Hub and built-in corpora into one shape: `Conversation`.

Training (train/core/data.py) and evaluation (eval/) both read data through `read_conversations`, so a
file that trains also evaluates, and every error names the file and the 0-based record index.

Sources: `.jsonl`, `.json` (an array, or JSON Lines), `.parquet`, `.txt`, gzip of the JSON ones
(`.jsonl.gz`, `.json.gz`), a directory written by `datasets.save_to_disk`, `hf:owner/name[:split]`
(`datasets.load_dataset`; a local folder of data files works too), the built-in `stdlib[:split]` and the
built-in chat prompts `prompts[:split]` (data/chat_prompts.py).

Formats (auto-detected from each record's keys, in FORMAT_KEYS order; `format=` overrides):
- messages: `messages: [{role, content}]`, optional `tools`; a content that is a list of OpenAI content parts
  is read as their text, concatenated (data/content.py; a non-text part is refused).
- sharegpt: `conversations: [{from, value}]`, optional `system`, `tools`; speakers mapped by SHAREGPT_ROLES;
  a preference record's `chosen` reply (LLaMA-Factory DPO files) becomes the last assistant turn.
- alpaca: `instruction`, `output`, optional `input` (user = instruction + "\\n\\n" + input), `system`,
  `history: [[user, assistant]]`; or `instances: [{input, output}]` (Alpaca seed tasks: one per instance).
- turns: `turns: [user...]` (MT-bench, EAGLE eval sets), optional `reference: [assistant...]` interleaved (a
  `reference` of another shape, as in Spec-Bench's RAG rows, is not answers and is left unread).
- pair: `question`/`answer` (GSM8K), `prompt`/`completion`, `prompt`/`response`, `prompt`/`canonical_solution`.
- answers: `choices: [{turns: [assistant...]}]` (FastChat answer files): assistant turns only.
- text: `text` (or a `.txt` file): a plain-text document, trained on every token.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .chat_prompts import SOURCES as CHAT_PROMPT_SOURCES
from .chat_prompts import chat_prompts
from .formats import FORMATS, ROLES, Conversation, _convert, detect_format

__all__ = [
    "FORMATS",
    "ROLES",
    "Conversation",
    "detect_format",
    "prompt_turns",
    "read_conversations",
    "with_answers",
]

logger = logging.getLogger(__name__)

_STDLIB_SPLITS = {"stdlib": "all", "stdlib:all": "all", "stdlib:train": "train", "stdlib:heldout": "heldout"}


def read_conversations(source: str, format: str = "auto", limit: int | None = None) -> list[Conversation]:
    """Read every record of `source` as a Conversation.

    Args:
        source: a file path, a `save_to_disk` directory, `hf:owner/name[:split]`, `stdlib[:split]` or
            `prompts[:split]`.
        format: one of FORMATS, or "auto" to detect it from each record's keys.
        limit: stop after this many conversations (None: all).

    Returns:
        The conversations in file order.

    Raises:
        FileNotFoundError: the file or directory does not exist.
        ValueError: unreadable data (not UTF-8, bad JSON, unknown shape, bad message), naming the record.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format={format!r} is not known; expected 'auto' or one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit} is negative; expected None (all records) or a count >= 0")
    if source in _STDLIB_SPLITS:
        from .stdlib_corpus import stdlib_conversations  # lazy: scanning the stdlib takes seconds

        rows = stdlib_conversations(_STDLIB_SPLITS[source])  # type: ignore[arg-type]
        return _convert(enumerate(rows), source, format, limit)
    if source in CHAT_PROMPT_SOURCES:
        return _convert(enumerate(chat_prompts(CHAT_PROMPT_SOURCES[source])), source, format, limit)
    if source.startswith("hf:"):
        return _convert(_hub_records(source), source, format, limit)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"data source {source!r} does not exist; expected a .jsonl/.json/.parquet/.txt file (optionally "
            f".gz), a save_to_disk directory, 'hf:owner/name[:split]' or one of "
            f"{sorted(_STDLIB_SPLITS) + sorted(CHAT_PROMPT_SOURCES)}"
        )
    if path.is_dir():
        return _convert(_disk_records(path), source, format, limit)
    if path.name.endswith(".txt"):  # each document becomes a `text` record
        return _convert(
            enumerate({"text": d} for d in _text_documents(_read_text(path))), source, format, limit
        )
    return _convert(_file_records(path), source, format, limit)


def prompt_turns(conv: Conversation) -> list[list[dict[str, Any]]]:
    """The prompts an evaluator sends for `conv`: one per user turn.

    Prompt k holds the system messages and the user messages up to and including the k-th user turn, in
    order; the data's assistant (and tool) messages are left out, because a multi-turn evaluation (MT-bench)
    answers turn k after the model's OWN answers to turns 0..k-1: the evaluator inserts those itself after
    each user message but the last.

    Args:
        conv: a chat conversation (a text document has no prompts).

    Returns:
        One message list per user turn; empty when the conversation has no user turn.
    """
    kept: list[dict[str, Any]] = []
    prompts: list[list[dict[str, Any]]] = []
    for message in conv.messages:
        if message["role"] in ("system", "user"):
            kept.append(message)
        if message["role"] == "user":
            prompts.append(list(kept))
    return prompts


def with_answers(prompt: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
    """`prompt` (one of `prompt_turns`) with the model's own `answers` inserted after each earlier user turn."""
    out, users = [], 0
    for message in prompt:
        out.append(message)
        if message["role"] == "user":
            if users < len(answers):
                out.append({"role": "assistant", "content": answers[users]})
            users += 1
    return out


# ----------------------------------------------------------------------------------------------- sources


def _read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: not a valid gzip file ({e}); expected gzip-compressed data") from e
    return data


def _read_text(path: Path) -> str:
    data = _read_bytes(path)
    try:
        return data.decode("utf-8-sig")  # -sig: tolerate the byte-order mark some editors write
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset {e.start} (line {line}) is "
            "invalid UTF-8; expected UTF-8. Re-encode the file, e.g. `iconv -f latin1 -t utf-8`."
        ) from e


def _file_records(path: Path) -> Iterator[tuple[int, Any]]:
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        yield from _parquet_records(path)
        return
    if not name.endswith((".json", ".jsonl")):
        raise ValueError(
            f"{path}: unsupported file type; expected .jsonl, .json, .parquet or .txt (JSON optionally .gz)"
        )
    text = _read_text(path)
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; expected JSON records")
    if name.endswith(".json"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            if text.lstrip().startswith("["):
                raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
            parsed = None  # not one JSON document: JSON Lines under a .json name
        if parsed is not None:
            yield from enumerate(parsed if isinstance(parsed, list) else [parsed])
            return
    # JSON Lines. Split on "\n" only: str.splitlines() would also split on U+2028, which is legal inside
    # JSON strings.
    index = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{index}: invalid JSON on line {lineno}, column {e.colno}: {e.msg}; expected one JSON "
                "object per line (JSON Lines)"
            ) from e
        yield index, record
        index += 1


def _parquet_records(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # a dependency of `datasets`

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _disk_records(path: Path) -> Iterator[tuple[int, Any]]:
    if not any((path / f).exists() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
        raise ValueError(
            f"{path}: directory is not a dataset written by datasets' save_to_disk (no dataset_dict.json or "
            f"state.json); for a folder of data files use 'hf:{path}', or name a file"
        )
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{path}: the saved DatasetDict has splits {sorted(ds)} but no 'train' split")
        ds = ds["train"]
    yield from enumerate(ds)


def _hub_records(source: str) -> Iterator[tuple[int, Any]]:
    name, _, split = source[len("hf:") :].partition(":")
    split = split or "train"
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets raises many types; all mean "this source does not load"
        raise ValueError(
            f"{source}: datasets.load_dataset({name!r}, split={split!r}) failed: {e}. Expected a Hub dataset "
            "id ('owner/name') or a local folder of data files, and an existing split; without network, "
            "download the data first and point at the files."
        ) from e
    yield from enumerate(ds)


def _text_documents(text: str) -> list[str]:
    """Documents of a .txt file: blank-line separated blocks; a file without blank lines is one per line.

    The second rule reads LLaMA-Factory's wiki_demo.txt (one article per line, as datasets' `text` builder
    does), the first reads hard-wrapped prose, where single newlines are not document breaks.
    """
    blocks = [b for b in re.split(r"\n[ \t]*\n\s*", text.replace("\r\n", "\n").strip()) if b.strip()]
    if len(blocks) == 1:
        return [line for line in blocks[0].split("\n") if line.strip()]
    return blocks
