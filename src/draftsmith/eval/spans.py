"""Which answer tokens are a tool call and which are reasoning, and tau over each kind of span.

A drafter trained on prose drafts JSON arguments badly, and one trained with thinking on drafts answers badly
with it off (or the reverse): one tau over everything hides both. The spans are found in the decoded text by the
syntaxes the chat templates of the served families write:

tool calls   `<tool_call>...</tool_call>` (Hermes, Qwen2.5/3, SmolLM2), `<|python_tag|>...` up to `<|eom_id|>` or
             `<|eot_id|>` (Llama 3.1), `[TOOL_CALLS]...` to the end (Mistral), and a JSON call
             `{"name": ..., "arguments" | "parameters": ...}` written as text (ShareGPT `function_call` turns,
             servers without a tool parser)
reasoning    `<think>...</think>` (Qwen3, DeepSeek-R1; a generation prompt that opens `<think>` starts the answer in
             it), `<|channel|>analysis<|message|>...<|end|>` (gpt-oss)

An unclosed span runs to the end of the answer. A verification step belongs to the span of the first token it
commits (the position its drafts start at); tau of a span = tokens committed by its steps / its steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

TOOL_CALL = (
    re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL),
    re.compile(r"<\|python_tag\|>.*?(?:<\|eom_id\|>|<\|eot_id\|>|\Z)", re.DOTALL),
    re.compile(r"\[TOOL_CALLS\].*\Z", re.DOTALL),
)
REASONING = (
    re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL),
    re.compile(r"<\|channel\|>analysis<\|message\|>.*?(?:<\|end\|>|\Z)", re.DOTALL),
)
_JSON_CALL = re.compile(r'\{\s*"name"\s*:')
PROMPT_TAIL_TOKENS = 32  # enough of the prompt to see a `<think>` its generation prompt opened
KINDS = {"tool_call": (TOOL_CALL, "prose"), "reasoning": (REASONING, "answer")}


def json_calls(text: str) -> list[tuple[int, int]]:
    """Character spans of tool calls written as JSON objects with a name and arguments (or parameters)."""
    spans, decoder, pos = [], json.JSONDecoder(), 0
    while (m := _JSON_CALL.search(text, pos)) is not None:
        try:
            value, end = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            pos = m.end()
            continue
        if isinstance(value, dict) and ("arguments" in value or "parameters" in value):
            spans.append((m.start(), end))
        pos = end
    return spans


def char_spans(text: str, kind: str) -> list[tuple[int, int]]:
    """The character spans of `kind` in `text`, sorted; a JSON call inside a tagged call is part of it."""
    spans = [(m.start(), m.end()) for pattern in KINDS[kind][0] for m in pattern.finditer(text)]
    if kind == "tool_call":
        spans += [(a, b) for a, b in json_calls(text) if not any(x <= a < y for x, y in spans)]
    return sorted(spans)


def token_spans(tokenizer: Any, prompt: Sequence[int], tokens: Sequence[int]) -> dict[str, list[bool]]:
    """For each kind, whether each answer token lies in such a span (a token starting inside one does).

    The prompt's last tokens are decoded with the answer, so a span the generation prompt opened is seen.
    """
    tail = list(prompt[-PROMPT_TAIL_TOKENS:])
    ids = tail + list(tokens)
    starts = [len(tokenizer.decode(ids[:k], skip_special_tokens=False)) for k in range(len(tail), len(ids))]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    out = {}
    for kind in KINDS:
        spans = char_spans(text, kind)
        out[kind] = [any(a <= s < b for a, b in spans) for s in starts]
    return out


def by_span(turns: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """`{span: {"steps", "tokens", "tau"}}`: tool_call and prose when an answer made a tool call or the data
    offered tools; reasoning and answer when an answer reasoned. Turns without `spans` are left out."""
    counts: dict[str, list[int]] = {}
    shown: set[str] = set()
    for t in turns:
        if t.spans is None:
            continue
        for kind, (_, other) in KINDS.items():
            inside = t.spans[kind]
            if any(inside) or (kind == "tool_call" and t.has_tools):
                shown.add(kind)
            position = 1  # the prefill committed token 0; each step commits from here
            for step in t.spec.steps:
                label = kind if position < len(inside) and inside[position] else other
                steps, committed = counts.setdefault(label, [0, 0])
                counts[label] = [steps + 1, committed + step.committed]
                position += step.committed
    out = {}
    for kind, (_, other) in KINDS.items():
        if kind in shown:
            for label in (kind, other):
                steps, committed = counts.get(label, [0, 0])
                out[label] = {
                    "steps": steps,
                    "tokens": committed,
                    "tau": committed / steps if steps else None,
                }
    return out
