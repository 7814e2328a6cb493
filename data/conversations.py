"""Read chat data from files, saved datasets, the Hub and built-in corpora into one shape: `Conversation`.

Training (train/core/data.py) and evaluation (eval/) both read data through `read_conversations`, so a
file that trains also evaluates, and every error names the file and the 0-based record index.

Sources: `.jsonl`, `.json` (an array, or JSON Lines), `.parquet`, `.txt`, gzip of the JSON ones
(`.jsonl.gz`, `.json.gz`), a directory written by `datasets.save_to_disk`, `hf:owner/name[:split]`
(`datasets.load_dataset`; a local folder of data files works too) and the built-in `stdlib[:split]`.

Formats (auto-detected from the keys of the first record, in FORMAT_KEYS order; `format=` overrides):
- messages: `messages: [{role, content}]`, optional `tools`.
- sharegpt: `conversations: [{from, value}]`, optional `system`, `tools`; speakers mapped by SHAREGPT_ROLES;
  a preference record's `chosen` reply (LLaMA-Factory DPO files) becomes the last assistant turn.
- alpaca: `instruction`, `output`, optional `input` (user = instruction + "\\n\\n" + input), `system`,
  `history: [[user, assistant]]`; or `instances: [{input, output}]` (Alpaca seed tasks: one per instance).
- turns: `turns: [user...]` (MT-bench, EAGLE eval sets), optional `reference: [assistant...]` interleaved.
- pair: `question`/`answer` (GSM8K), `prompt`/`completion`, `prompt`/`response`, `prompt`/`canonical_solution`.
- answers: `choices: [{turns: [assistant...]}]` (FastChat answer files): assistant turns only.
- text: `text` (or a `.txt` file): a plain-text document, trained on every token.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker -> role. `function_call` is the model's own tool call: trained like any assistant turn.
SHAREGPT_ROLES = {
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "assistant", "chatgpt", "bard", "bing", "function_call"), "assistant"),
    "system": "system",
    **dict.fromkeys(("observation", "function", "tool"), "tool"),
}
# Format -> alternative key sets that identify it. Order matters: Alpaca files often carry a redundant
# `text` field (the rendered prompt), so `text` is tried last.
FORMAT_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "messages": (("messages",),),
    "sharegpt": (("conversations",),),
    "alpaca": (("instruction", "output"), ("instruction", "instances")),
    "turns": (("turns",),),
    "pair": (
        ("question", "answer"),
        ("prompt", "completion"),
        ("prompt", "response"),
        ("prompt", "canonical_solution"),
    ),
    "answers": (("choices",),),
    "text": (("text",),),
}
FORMATS = tuple(FORMAT_KEYS)
_STDLIB_SPLITS = {"stdlib": "all", "stdlib:all": "all", "stdlib:train": "train", "stdlib:heldout": "heldout"}


@dataclass
class Conversation:
    """One training or evaluation record.

    Attributes:
        messages: OpenAI-style messages `{"role", "content"}`, roles in ROLES; empty for a text document.
        text: a plain-text document (then `messages` is empty), trained on every token.
        source: where it came from, `"<file>:<record index>"`, for error messages.
        id: the record's own id (`id`, `question_id` or `task_id`) when it has one.
        tools: tool JSON schemas offered to the model (passed to the chat template), if any.
    """

    messages: list[dict[str, str]]
    text: str | None = None
    source: str = ""
    id: str | None = None
    tools: list[dict[str, Any]] | None = None


def read_conversations(source: str, format: str = "auto", limit: int | None = None) -> list[Conversation]:
    """Read every record of `source` as a Conversation.

    Args:
        source: a file path, a `save_to_disk` directory, `hf:owner/name[:split]` or `stdlib[:split]`.
        format: one of FORMATS, or "auto" to detect it from the keys of the first record.
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
    if source.startswith("hf:"):
        return _convert(_hub_records(source), source, format, limit)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"data source {source!r} does not exist; expected a .jsonl/.json/.parquet/.txt file (optionally "
            f".gz), a save_to_disk directory, 'hf:owner/name[:split]' or one of {sorted(_STDLIB_SPLITS)}"
        )
    if path.is_dir():
        return _convert(_disk_records(path), source, format, limit)
    if path.name.endswith(".txt"):  # each document becomes a `text` record
        return _convert(
            enumerate({"text": d} for d in _text_documents(_read_text(path))), source, format, limit
        )
    return _convert(_file_records(path), source, format, limit)


def detect_format(record: dict[str, Any], where: str) -> str:
    """The first format in FORMAT_KEYS whose keys `record` has; ValueError listing the formats otherwise."""
    for name, key_sets in FORMAT_KEYS.items():
        if any(all(k in record for k in keys) for keys in key_sets):
            return name
    raise ValueError(
        f"{where}: cannot tell the data format from keys {sorted(record)}; expected one of: {_formats_help()}. "
        "Rename the fields, or pass the format explicitly."
    )


def prompt_turns(conv: Conversation) -> list[list[dict[str, str]]]:
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
    kept: list[dict[str, str]] = []
    prompts: list[list[dict[str, str]]] = []
    for message in conv.messages:
        if message["role"] in ("system", "user"):
            kept.append(message)
        if message["role"] == "user":
            prompts.append(list(kept))
    return prompts


def with_answers(prompt: list[dict[str, str]], answers: list[str]) -> list[dict[str, str]]:
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


# ----------------------------------------------------------------------------------------------- formats


def _convert(
    records: Iterator[tuple[int, Any]], label: str, format: str, limit: int | None
) -> list[Conversation]:
    out: list[Conversation] = []
    fmt = None if format == "auto" else format
    seen = 0
    for index, record in records:
        if limit is not None and len(out) >= limit:
            break
        seen += 1
        where = f"{label}:{index}"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: record is a JSON {type(record).__name__}; expected a JSON object")
        if fmt is None:
            fmt = detect_format(record, where)
            logger.info("%s: reading as format %r", label, fmt)
        for keys in FORMAT_KEYS[fmt]:
            if all(k in record for k in keys):
                break
        else:
            raise ValueError(
                f"{where}: format {fmt!r} needs keys {' or '.join(' + '.join(k) for k in FORMAT_KEYS[fmt])}; "
                f"found keys {sorted(record)}. Pass the right format, or fix the record."
            )
        out.extend(_CONVERTERS[fmt](record, where))
    if seen == 0 and limit != 0:
        raise ValueError(f"{label}: no records found; expected at least one record")
    return out[:limit] if limit is not None else out


def _formats_help() -> str:
    return "; ".join(
        f"{name} ({' or '.join(' + '.join(k) for k in keys)})" for name, keys in FORMAT_KEYS.items()
    )


def _record_id(record: dict[str, Any]) -> str | None:
    for key in ("id", "question_id", "task_id"):
        if record.get(key) is not None:
            return str(record[key])
    return None


def _expect(value: Any, kind: type, what: str, where: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{where}: {what} is a {type(value).__name__}; expected a {kind.__name__}")
    return value


def _string_list(value: Any, what: str, where: str) -> list[str]:
    return [_expect(v, str, f"{what}[{k}]", where) for k, v in enumerate(_expect(value, list, what, where))]


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _message(role: Any, content: Any, k: int, where: str) -> dict[str, str]:
    if not isinstance(role, str) or not role.strip():
        raise ValueError(
            f"{where}: message {k} has a missing or empty role ({role!r}); expected one of {ROLES}"
        )
    if role not in ROLES:
        raise ValueError(f"{where}: message {k} has role {role!r}; expected one of {ROLES}")
    if not isinstance(content, str):
        raise ValueError(
            f"{where}: message {k} ({role}) has content of type {type(content).__name__}; expected a string "
            "(content-part lists and tool_calls without text are not supported: flatten them to text)"
        )
    return _msg(role, content)


def _tools(record: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    tools = record.get("tools")
    if tools is None or tools == "":
        return None
    if isinstance(tools, str):  # LLaMA-Factory stores the schema list as a JSON string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: 'tools' is a string but not valid JSON ({e.msg})") from e
    tools = [tools] if isinstance(tools, dict) else _expect(tools, list, "'tools'", where)
    return [_expect(t, dict, f"tools[{k}]", where) for k, t in enumerate(tools)]


def _system(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    return [_msg("system", _expect(record["system"], str, "'system'", where))] if record.get("system") else []


def _from_messages(record: dict[str, Any], where: str) -> list[Conversation]:
    messages = [
        _message(_expect(m, dict, f"message {k}", where).get("role"), m.get("content"), k, where)
        for k, m in enumerate(_expect(record["messages"], list, "'messages'", where))
    ]
    return [Conversation(messages, source=where, id=_record_id(record), tools=_tools(record, where))]


def _sharegpt_turn(turn: Any, k: int, where: str) -> dict[str, str]:
    _expect(turn, dict, f"turn {k}", where)
    if "from" not in turn and "role" in turn:  # some ShareGPT exports use OpenAI keys inside `conversations`
        return _message(turn["role"], turn.get("content"), k, where)
    speaker = turn.get("from")
    if speaker not in SHAREGPT_ROLES:
        raise ValueError(
            f"{where}: turn {k} has from={speaker!r}; expected one of {sorted(SHAREGPT_ROLES)} (or role/content)"
        )
    return _message(SHAREGPT_ROLES[speaker], turn.get("value"), k, where)


def _from_sharegpt(record: dict[str, Any], where: str) -> list[Conversation]:
    turns = _expect(record["conversations"], list, "'conversations'", where)
    messages = _system(record, where) + [_sharegpt_turn(t, k, where) for k, t in enumerate(turns)]
    if isinstance(record.get("chosen"), dict):  # preference data (DPO): train on the preferred reply
        messages.append(_sharegpt_turn(record["chosen"], len(turns), where))
    return [Conversation(messages, source=where, id=_record_id(record), tools=_tools(record, where))]


def _from_alpaca(record: dict[str, Any], where: str) -> list[Conversation]:
    instruction = _expect(record["instruction"], str, "'instruction'", where)
    head = _system(record, where)
    for k, pair in enumerate(record.get("history") or []):
        strings = _string_list(pair, f"history[{k}]", where)
        if len(strings) != 2:
            raise ValueError(f"{where}: history[{k}] has {len(strings)} strings; expected [user, assistant]")
        head += [_msg("user", strings[0]), _msg("assistant", strings[1])]
    # Stanford Alpaca's seed tasks hold several {input, output} instances per instruction.
    single = "output" in record
    instances = [record] if single else _expect(record["instances"], list, "'instances'", where)
    rid, out = _record_id(record), []
    for k, inst in enumerate(instances):
        _expect(inst, dict, f"instance {k}", where)
        inp = _expect(inst.get("input") or "", str, "'input'", where)
        user = f"{instruction}\n\n{inp}" if inp.strip() else instruction
        answer = _expect(inst.get("output"), str, "'output'", where)
        conv_id = rid if single or rid is None else f"{rid}#{k}"
        out.append(
            Conversation([*head, _msg("user", user), _msg("assistant", answer)], source=where, id=conv_id)
        )
    return out


def _from_turns(record: dict[str, Any], where: str) -> list[Conversation]:
    refs = _string_list(record.get("reference") or [], "'reference'", where)
    messages = []
    for k, turn in enumerate(_string_list(record["turns"], "'turns'", where)):
        messages += [_msg("user", turn)] + ([_msg("assistant", refs[k])] if k < len(refs) else [])
    return [Conversation(messages, source=where, id=_record_id(record))]


def _from_pair(record: dict[str, Any], where: str) -> list[Conversation]:
    user_key, answer_key = next(keys for keys in FORMAT_KEYS["pair"] if all(k in record for k in keys))
    user = _expect(record[user_key], str, repr(user_key), where)
    answer = _expect(record[answer_key], str, repr(answer_key), where)
    return [
        Conversation([_msg("user", user), _msg("assistant", answer)], source=where, id=_record_id(record))
    ]


def _from_answers(record: dict[str, Any], where: str) -> list[Conversation]:
    choices = _expect(record["choices"], list, "'choices'", where)
    first = _expect(choices[0] if choices else None, dict, "choices[0]", where)
    messages = [_msg("assistant", t) for t in _string_list(first.get("turns"), "choices[0].turns", where)]
    return [Conversation(messages, source=where, id=_record_id(record))]


def _from_text(record: dict[str, Any], where: str) -> list[Conversation]:
    text = _expect(record["text"], str, "'text'", where)
    return [Conversation(messages=[], text=text, source=where, id=_record_id(record))]


_CONVERTERS: dict[str, Callable[[dict[str, Any], str], list[Conversation]]] = {
    "messages": _from_messages,
    "sharegpt": _from_sharegpt,
    "alpaca": _from_alpaca,
    "turns": _from_turns,
    "pair": _from_pair,
    "answers": _from_answers,
    "text": _from_text,
}
