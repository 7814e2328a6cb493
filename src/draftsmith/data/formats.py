"""The record formats draftsmith reads (see data/conversations.py for the list), each converted into the one
shape training and evaluation use: `Conversation`. Detection goes by each record's keys, in FORMAT_KEYS order
(a file may mix formats: `draftsmith data mix` writes chat records and documents in one file)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .content import text_of

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


@dataclass
class Conversation:
    """One training or evaluation record.

    Attributes:
        messages: OpenAI-style messages `{"role", "content"}`, roles in ROLES; empty for a text document. A
            `messages` record's assistant turns keep `tool_calls` (OpenAI form) and `reasoning_content`, and its
            tool turns `tool_call_id` and `name`: the chat template renders what it knows of them.
        text: a plain-text document (then `messages` is empty), trained on every token.
        source: where it came from, `"<file>:<record index>"`, for error messages.
        id: the record's own id (`id`, `question_id` or `task_id`) when it has one.
        tools: tool JSON schemas offered to the model (passed to the chat template), if any.
        category: the record's `category` string (MT-bench's eight, the built-in prompts' kinds), if any: the
            evaluator reports tau per category.
    """

    messages: list[dict[str, Any]]
    text: str | None = None
    source: str = ""
    id: str | None = None
    tools: list[dict[str, Any]] | None = None
    category: str | None = None


def detect_format(record: dict[str, Any], where: str) -> str:
    """The first format in FORMAT_KEYS whose keys `record` has; ValueError listing the formats otherwise."""
    for name, key_sets in FORMAT_KEYS.items():
        if any(all(k in record for k in keys) for keys in key_sets):
            return name
    raise ValueError(
        f"{where}: cannot tell the data format from keys {sorted(record)}; expected one of: {_formats_help()}. "
        "Rename the fields, or pass the format explicitly."
    )


def _convert(
    records: Iterator[tuple[int, Any]], label: str, format: str, limit: int | None
) -> list[Conversation]:
    out: list[Conversation] = []
    fmt = format
    logged: set[str] = set()
    seen = 0
    for index, record in records:
        if limit is not None and len(out) >= limit:
            break
        seen += 1
        where = f"{label}:{index}"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: record is a JSON {type(record).__name__}; expected a JSON object")
        if format == "auto":  # each record by its own keys: one file may mix formats (`draftsmith data mix`)
            fmt = detect_format(record, where)
            if fmt not in logged:
                logged.add(fmt)
                logger.info("%s: reading as format %r", where, fmt)
        for keys in FORMAT_KEYS[fmt]:
            if all(k in record for k in keys):
                break
        else:
            raise ValueError(
                f"{where}: format {fmt!r} needs keys {' or '.join(' + '.join(k) for k in FORMAT_KEYS[fmt])}; "
                f"found keys {sorted(record)}. Pass the right format, or fix the record."
            )
        convs = _CONVERTERS[fmt](record, where)
        category = record.get("category")
        if isinstance(category, str) and category:  # any other shape is a field the loader does not use
            for conv in convs:
                conv.category = category
        out.extend(convs)
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


def _msg(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def _message(role: Any, content: Any, k: int, where: str) -> dict[str, Any]:
    if not isinstance(role, str) or not role.strip():
        raise ValueError(
            f"{where}: message {k} has a missing or empty role ({role!r}); expected one of {ROLES}"
        )
    if role not in ROLES:
        raise ValueError(f"{where}: message {k} has role {role!r}; expected one of {ROLES}")
    if isinstance(content, list):  # OpenAI content parts: their text, concatenated
        content = text_of(content, f"{where}: message {k} ({role})")
    if not isinstance(content, str):
        raise ValueError(
            f"{where}: message {k} ({role}) has content of type {type(content).__name__}; expected a string or "
            "a list of text parts"
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


def _system(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    return [_msg("system", _expect(record["system"], str, "'system'", where))] if record.get("system") else []


def _from_messages(record: dict[str, Any], where: str) -> list[Conversation]:
    messages = [
        _openai_message(_expect(m, dict, f"message {k}", where), k, where)
        for k, m in enumerate(_expect(record["messages"], list, "'messages'", where))
    ]
    return [Conversation(messages, source=where, id=_record_id(record), tools=_tools(record, where))]


# The OpenAI message fields kept besides role and content, by role, with their type: chat templates render
# them (Qwen3's and DeepSeek-R1's render `reasoning_content`, tool-use templates `tool_calls`), and
# `draftsmith data regenerate --endpoint` writes them as the server returned them.
_EXTRA_FIELDS: dict[str, dict[str, type]] = {
    "assistant": {"tool_calls": list, "reasoning_content": str},
    "tool": {"tool_call_id": str, "name": str},
}


def _openai_message(m: dict[str, Any], k: int, where: str) -> dict[str, Any]:
    extras = {
        key: _expect(m[key], kind, f"message {k} {key!r}", where)
        for key, kind in _EXTRA_FIELDS.get(str(m.get("role")), {}).items()
        if m.get(key) not in (None, "", [])
    }
    content = m.get("content")
    if content is None and "tool_calls" in extras:  # an assistant turn that only calls tools
        content = ""
    return _message(m.get("role"), content, k, where) | extras


def _sharegpt_turn(turn: Any, k: int, where: str) -> dict[str, Any]:
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


def _reference_answers(record: dict[str, Any]) -> list[str]:
    """MT-bench's `reference`: one answer per turn, which becomes that turn's assistant reply. A `reference` of
    another shape is not answers (Spec-Bench's RAG rows hold lists of retrieved documents): left unread, as
    every field no format reads is."""
    refs = record.get("reference")
    if isinstance(refs, list) and all(isinstance(r, str) for r in refs):
        return refs
    return []


def _from_turns(record: dict[str, Any], where: str) -> list[Conversation]:
    refs = _reference_answers(record)
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
