"""`draftsmith data regenerate --endpoint URL`: the same regeneration, through the server that serves the target.

Up to `--concurrency` conversations are in flight, one request each (a conversation's turns go one after the
other: each is conditioned on the model's own earlier answers). A finished conversation is appended to OUT at
once, in the order they finish, with its input `index`; so a killed run loses at most the conversations in
flight, and a rerun skips what OUT (and OUT.failed.jsonl) already hold. When the server stops answering, the
run stops too, after the retries, and says how far it got: nothing is marked failed for a server that is down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from tqdm.auto import tqdm

from draftsmith.data.conversations import Conversation, read_conversations
from draftsmith.data.endpoint import (
    EndpointClient,
    Regenerated,
    api_base,
    openai_tools,
    regenerate_conversation,
)
from draftsmith.data.regen_output import RegenOutput, RowWriter, Sampling, new_counts, run_meta
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.http import RequestRejected, ServerUnavailable

from .regenerate_settings import RegenerateArgs

COUNT_KEYS = ("answers", "truncated", "tool_call_differs", "prompt_tokens", "completion_tokens")


def regenerate_via_endpoint(settings: RegenerateArgs) -> dict[str, Any]:
    """Run the regeneration `settings` describe through `settings.endpoint`; returns the counts."""
    client = client_for(settings)
    model = served_model(client, settings.model)
    convs = read_conversations(settings.data, settings.format, settings.max_samples)
    output = RegenOutput(settings.out, endpoint_meta(settings, client, model))
    done = output.resume()
    todo = [i for i in range(len(convs)) if i not in done]
    counts = new_counts(len(convs), len(todo), COUNT_KEYS)
    bar = tqdm(total=len(todo), desc="regenerate", unit="conv", disable=settings.no_progress)
    answer = answerer(client, model["id"], settings.sampling, convs)
    start = time.perf_counter()
    with output.appending() as writer:

        def finished(i: int, result: Regenerated) -> None:
            record(writer, convs[i], i, result, counts)
            bar.update(1)

        stopped = answer_in_flight(client, settings.concurrency, iter(todo), answer, finished)
    bar.close()
    counts["seconds"] = time.perf_counter() - start
    output.finish(counts=counts, tool_choice=client.tool_choice)
    if stopped is not None:
        raise UserError(
            f"{stopped}; {counts['written']} conversations written and {counts['failed']} failed this run, "
            f"{counts['skipped']} were done before: rerun the same command to continue"
        )
    assert counts["written"] + counts["failed"] + counts["skipped"] == counts["input"]
    return counts


def client_for(settings: RegenerateArgs) -> EndpointClient:
    """The client for `--endpoint`, with the key `--api-key-env` names."""
    assert settings.endpoint is not None  # regenerate() sends only --endpoint runs here
    key = None
    if settings.api_key_env:
        key = os.environ.get(settings.api_key_env)
        if not key:
            raise UserError(
                f"--api-key-env {settings.api_key_env}: that environment variable is not set or empty"
            )
    return EndpointClient(api_base(settings.endpoint), key, settings.timeout, settings.retries)


def served_model(client: EndpointClient, asked: str | None) -> dict[str, Any]:
    """The served model to ask (`--model`, else the server's only one), with what the server says of it."""
    try:
        models = client.models()
    except ServerUnavailable as err:
        raise UserError(f"--endpoint: {err}; is the server running?") from None
    names = [str(m.get("id")) for m in models]
    if asked is None and len(names) != 1:
        raise UserError(f"--endpoint serves {len(names)} models ({', '.join(names)}): pick one with --model")
    name = asked or names[0]
    if name not in names:
        raise UserError(f"--model {name!r} is not served at {client.base}; it serves {', '.join(names)}")
    return next(m for m in models if str(m.get("id")) == name)


def endpoint_meta(settings: RegenerateArgs, client: EndpointClient, model: dict[str, Any]) -> dict[str, Any]:
    """The meta file's settings: the served model is the target; where and how it was asked is recorded."""
    return run_meta(
        settings.sampling,
        {"served_model": model["id"]},
        settings.data,
        settings.format,
        endpoint=client.base,  # recorded, not checked on resume: a restarted server may move
        server={k: model[k] for k in ("root", "max_model_len", "owned_by") if k in model},
        concurrency=settings.concurrency,
    )


def request_body(model: str, sampling: Sampling, conv: Conversation, index: int) -> Any:
    """The chat-completions request for turn `turn` of conversation `index` (a function of both: a rerun,
    whatever the concurrency, asks with the same seed)."""

    def body(messages: list[dict[str, Any]], turn: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed * 1_000_003 + index * 1_009 + turn,
        }
        if sampling.top_k > 0:
            out["top_k"] = sampling.top_k  # vLLM, SGLang, TGI and llama.cpp take it; OpenAI does not
        if conv.tools:
            out["tools"] = openai_tools(conv.tools)
        return out

    return body


def answerer(
    client: EndpointClient, model: str, sampling: Sampling, convs: list[Conversation]
) -> Callable[[int], Regenerated]:
    """What a worker thread runs for conversation `i`: its turns one after the other, one request each."""

    def answer(i: int) -> Regenerated:
        body = request_body(model, sampling, convs[i], i)
        return regenerate_conversation(convs[i], lambda messages, turn: client.chat(body(messages, turn)))

    return answer


def answer_in_flight(
    client: EndpointClient,
    concurrency: int,
    todo: Iterator[int],
    answer: Callable[[int], Regenerated],
    finished: Callable[[int, Regenerated], None],
) -> ServerUnavailable | None:
    """Keep `concurrency` conversations of `todo` in flight and hand each one that finishes (or whose request
    was refused) to `finished`, in the order they finish. Returns why the server stopped answering (the others
    in flight then give up, and nothing more is asked), or None when `todo` is done."""
    stopped: ServerUnavailable | None = None
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="regenerate")
    try:
        running: dict[Future[Regenerated], int] = {}
        while True:
            while stopped is None and len(running) < concurrency and (i := next(todo, None)) is not None:
                running[pool.submit(answer, i)] = i
            if not running:
                return stopped
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                try:
                    result = future.result()
                except ServerUnavailable as err:
                    stopped = stopped or err
                    client.stop.set()  # the others in flight give up instead of retrying
                    continue
                except RequestRejected as err:  # this conversation's request was refused: recorded
                    result = Regenerated(None, str(err))
                finished(i, result)
    finally:  # Ctrl-C or an error: what is written stays; the requests in flight are not waited for
        client.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)


def record(
    writer: RowWriter, conv: Conversation, i: int, result: Regenerated, counts: dict[str, Any]
) -> None:
    """Append one finished conversation (or its failure) and count it; flushed at once."""
    if result.messages is None:
        writer.failure(i, conv, result.reason)
        writer.flush()
        counts["failed"] += 1
        return
    writer.row(i, conv, result.messages)
    writer.flush()
    counts["written"] += 1
    for key in COUNT_KEYS:
        counts[key] += int(getattr(result, key))
