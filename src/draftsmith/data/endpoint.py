"""A client for OpenAI-compatible chat-completions servers, and one conversation regenerated through it.

vLLM, SGLang, TGI and llama.cpp's server all answer `POST {base}/chat/completions`. The client needs only the
standard library: the engine runs elsewhere, and a regeneration of a million conversations is bound by the
server, not by HTTP. What a request can meet, and what the client does (runtime/http.py does the HTTP):

- the server is unreachable, misses the `--timeout` deadline, or answers 408 / 429 / 5xx: retried `retries`
  times with exponential backoff; then `ServerUnavailable`, which stops the whole run (the conversation is not
  marked failed: a rerun asks again);
- the server refuses to serve at all: 401 / 403 (the key), 404 / 405 (the route or the model), a redirect, any
  4xx but 400 / 413 / 422, or a 2xx that is not a completion (not JSON, an HTML page, no `choices`):
  `ServerRefused`, which stops the run at once, naming the endpoint, the status and the server's message;
  nothing is marked failed;
- 400 / 413 / 422 (a prompt longer than the server's context, a request it refuses for its content):
  `RequestRejected` with the server's message, which fails this conversation only;
- 400 because the server parses no tool calls (vLLM without `--enable-auto-tool-choice`): the client asks again
  with `tool_choice: none` and keeps doing so for the run; the model then writes its calls as text, which is
  kept as it wrote them.

An answer whose content is a list of content parts is flattened to its text (data/content.py), the form the
data pipeline reads.

`regenerate_conversation` walks one conversation: every user turn is answered by the model, conditioned on its
own earlier answers. A recorded tool result answers only the call it was recorded for, so the conversation goes
on past a tool turn only when the model made that same call (same name and arguments); otherwise it ends at the
model's own turn, which is still the target's text (counted as `tool_call_differs`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftsmith.runtime.http import HttpClient, ProtocolError, RequestRejected

from .content import text_of
from .formats import Conversation

CONVERSATION_STATUS = {400, 413, 422}  # a refusal about this request's content, not about the server

_NO_TOOL_PARSER = re.compile(
    r"tool.choice.*(enable-auto-tool-choice|tool-call-parser)", re.IGNORECASE | re.DOTALL
)
_TOOL_CALL_TAGS = re.compile(r"^\s*<tool_call>\s*(.*?)\s*(</tool_call>)?\s*$", re.DOTALL)


def api_base(url: str) -> str:
    """The API root for `url`: `http://host:8000` and `http://host:8000/v1/chat/completions` both give
    `http://host:8000/v1`; any other path is kept as given (a proxy's prefix)."""
    url = url.rstrip("/").removesuffix("/chat/completions")
    if not url.startswith(("http://", "https://")):
        raise ValueError(
            f"--endpoint {url!r}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1"
        )
    return url + "/v1" if "/" not in url.split("://", 1)[1] else url


@dataclass
class Reply:
    """One answer: the assistant message as it is stored, why it ended, and the tokens the server counted."""

    message: dict[str, Any]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


class ServerRefused(RuntimeError):
    """The server will not serve this run (the key, the route, the model, or not an OpenAI-compatible answer):
    the run stops and nothing is marked failed."""


_ADVICE = {
    401: "check the key (--api-key-env names the variable that holds it)",
    403: "check the key and its permissions (--api-key-env)",
    404: "check --endpoint (the API root, e.g. http://HOST:8000/v1) and --model",
    405: "check --endpoint: it should be the API root, e.g. http://HOST:8000/v1",
}


def refused(err: RequestRejected) -> ServerRefused:
    """The run-stopping error for a refusal that is the server's (see the module), in one line (the client's
    error names the URL, the status and the server's message)."""
    advice = _ADVICE.get(
        err.status, "check that --endpoint is an OpenAI-compatible API root, e.g. http://HOST:8000/v1"
    )
    return ServerRefused(f"{err}; nothing was marked failed: {advice}")


@dataclass
class EndpointClient(HttpClient):
    """Chat completions from `base` (see `api_base`) through the runtime's HTTP client (deadline, retries)."""

    tool_choice: str = "auto"

    def models(self) -> list[dict[str, Any]]:
        """The served models (`GET /models`), each with its `id` (and vLLM's `root` and `max_model_len`)."""
        route = f"{self.base}/models"
        try:
            listing = self.request("GET", "/models").get("data")
        except RequestRejected as err:  # every status here is the server's: the run has not begun
            raise refused(err) from None
        if not isinstance(listing, list) or not all(isinstance(m, dict) and m.get("id") for m in listing):
            raise ServerRefused(
                f"{route} answered a model list without a `data` list of models with an `id` each "
                f"({json.dumps(listing)[:120]}); is --endpoint an OpenAI-compatible API root?"
            )
        return listing

    def chat(self, body: dict[str, Any]) -> Reply:
        """Ask once (with retries); falls back to `tool_choice: none` where the server parses no tool calls.
        Raises `ServerRefused` for a refusal that is the server's, `RequestRejected` for one that is the
        conversation's."""
        route = f"{self.base}/chat/completions"
        if body.get("tools") and "tool_choice" not in body:
            body = body | {"tool_choice": self.tool_choice}
        try:
            out = self._ask(body)
        except RequestRejected as err:
            if isinstance(err, ProtocolError) or err.status not in CONVERSATION_STATUS:
                raise refused(err) from None
            raise
        try:
            return completion(out)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise ServerRefused(
                f"{route} answered 200 with something that is not a chat completion ({err}): "
                f"{json.dumps(out)[:160]}; is --endpoint an OpenAI-compatible API root?"
            ) from None

    def _ask(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.request("POST", "/chat/completions", body)
        except RequestRejected as err:
            if body.get("tool_choice") != "auto" or not _NO_TOOL_PARSER.search(str(err)):
                raise
            self.tool_choice = "none"
            return self.request("POST", "/chat/completions", body | {"tool_choice": "none"})


def completion(out: dict[str, Any]) -> Reply:
    """The first choice of a chat-completions answer; KeyError / TypeError / ValueError where it is none."""
    choices = out["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("`choices` is not a list of choice objects")
    choice = choices[0]
    if not isinstance(choice.get("message"), dict):
        raise ValueError("its choice has no `message` object")
    usage = out["usage"] if isinstance(out.get("usage"), dict) else {}
    return Reply(
        assistant_message(choice["message"]),
        choice.get("finish_reason"),
        _count(usage.get("prompt_tokens")),
        _count(usage.get("completion_tokens")),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0  # a server that counts nothing counts 0


def assistant_message(raw: dict[str, Any]) -> dict[str, Any]:
    """The server's message as the data pipeline stores it: content (a content-part list flattened to its
    text), the tool calls in OpenAI form, and the reasoning (`reasoning_content`; newer vLLM names it
    `reasoning`) that templates with thinking render."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text_of(raw.get("content"), "the server's answer"),
    }
    calls = [
        {"id": c.get("id"), "type": "function", "function": dict(c["function"])}
        for c in raw.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if v is not None} for c in calls]
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if reasoning:
        message["reasoning_content"] = text_of(reasoning, "the server's reasoning")
    return message


def tool_calls_of(message: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The calls an assistant message makes, as (name, canonical JSON arguments): from `tool_calls`, else from a
    content that is a call written as JSON (`{"name": ..., "arguments": ...}`, a list of them, optionally inside
    <tool_call> tags, as ShareGPT's `function_call` turns and templates without a tool parser write them)."""
    if message.get("tool_calls"):
        found = [_call(c.get("function", c)) for c in message["tool_calls"]]
    else:
        text = str(message.get("content") or "")
        tagged = _TOOL_CALL_TAGS.match(text)
        try:
            parsed = json.loads(tagged.group(1) if tagged else text)
        except json.JSONDecodeError:
            return None
        found = [_call(c) for c in (parsed if isinstance(parsed, list) else [parsed])]
    return None if not found or None in found else [c for c in found if c is not None]


def _call(raw: Any) -> tuple[str, str] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    args = raw.get("arguments", raw.get("parameters", {}))
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # arguments that are not JSON compare as text
            args = json.loads(args)
    return raw["name"], json.dumps(args, sort_keys=True)


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas in the request's form: a bare function schema (ShareGPT / glaive data) is wrapped."""
    return [t if "type" in t else {"type": "function", "function": t} for t in tools]


@dataclass
class Regenerated:
    """One conversation's outcome: the messages (None: failed, with `reason`) and what it cost."""

    messages: list[dict[str, Any]] | None
    reason: str = ""
    answers: int = 0
    truncated: int = 0
    tool_call_differs: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def count(self, reply: Reply) -> None:
        """Count one of the model's answers: cut at the token limit or not, and the tokens it took."""
        self.answers += 1
        self.truncated += reply.finish_reason == "length"
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens


def regenerate_conversation(
    conv: Conversation, ask: Callable[[list[dict[str, Any]], int], Reply]
) -> Regenerated:
    """Answer every user turn of `conv` with `ask(messages so far, turn)`, keeping the model's own answers.

    The data's assistant turns are not kept; each only tells which call a recorded tool result answers. A run
    of tool messages is kept when the model's preceding answer made the recorded call(s) and is followed by the
    model's next answer; when the call differs, the conversation ends at the model's answer.
    """
    msgs = conv.messages
    if not any(m["role"] == "user" for m in msgs):
        return Regenerated(None, "no user turn (a text document or an assistant-only record)")
    out: list[dict[str, Any]] = []
    result = Regenerated(out)
    recorded: list[tuple[str, str]] | None = None  # the data's latest call
    answered: list[tuple[str, str]] | None = None  # the model's latest call
    reply: Reply | None = None
    results = 0  # tool results kept since the model's latest answer
    for k, message in enumerate(msgs):
        role = message["role"]
        if role == "assistant":
            recorded = tool_calls_of(message)
            continue
        if role == "tool":
            if reply is None or answered is None or answered != recorded:
                result.tool_call_differs = reply is not None
                break
            out.append(_tool_result(message, reply, results))
            results += 1
            if k + 1 < len(msgs) and msgs[k + 1]["role"] == "tool":
                continue  # the next result of the same call turn
        else:
            out.append(message)
            if role != "user":
                continue
        reply = ask(out, result.answers)
        results = 0
        out.append(reply.message)
        answered = tool_calls_of(reply.message)
        result.count(reply)
    if not result.answers:
        return Regenerated(None, "no user turn before the first tool result")
    while out[-1]["role"] != "assistant":  # a conversation ends with the model's answer
        out.pop()
    return result


def _tool_result(message: dict[str, Any], reply: Reply, n: int) -> dict[str, Any]:
    """The recorded tool `message`, result `n` since the model's answer `reply`, naming the call it answers by
    the server's id for that call (where the server gave one)."""
    ids = [c.get("id") for c in reply.message.get("tool_calls", [])]
    tool = dict(message)
    if n < len(ids) and ids[n]:
        tool["tool_call_id"] = ids[n]
    return tool
