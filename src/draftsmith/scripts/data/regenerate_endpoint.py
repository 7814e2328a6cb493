"""`draftsmith data regenerate --endpoint URL`: the same regeneration, through the server that serves the target.

Up to `--concurrency` conversations are in flight, one request each (a conversation's turns go one after the
other: each is conditioned on the model's own earlier answers). A finished conversation is appended to OUT at
once, in the order they finish, with its input `index`; so a killed run loses at most the conversations in
flight, and a rerun skips what OUT (and OUT.failed.jsonl) already hold.

What stops the run, marking nothing failed (a rerun after the fix goes on): a server that stops answering
(after the retries), one that refuses to serve (the key, the route, the model; an answer that is not a
completion: data/endpoint.py), a run whose first conversations are all refused with nothing answered (a
setting of the server's, not the conversations' fault), and Ctrl-C, which ends the requests in flight at once.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from draftsmith.data.conversations import Conversation, read_conversations
from draftsmith.data.endpoint import (
    EndpointClient,
    Regenerated,
    ServerRefused,
    api_base,
    openai_tools,
    regenerate_conversation,
)
from draftsmith.data.regen_output import (
    RegenOutput,
    RowWriter,
    Sampling,
    data_record,
    new_counts,
    run_meta,
)
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.http import Aborted, RequestRejected, ServerUnavailable

from .regenerate_settings import RegenerateArgs

COUNT_KEYS = ("answers", "truncated", "tool_call_differs", "prompt_tokens", "completion_tokens")


def regenerate_via_endpoint(
    settings: RegenerateArgs, seeded: bool = True, served_dtype: str = "float32"
) -> dict[str, Any]:
    """Run the regeneration `settings` describe through `settings.endpoint` (a seed in every request unless
    `seeded` is False; `served_dtype`: the weights' dtype where draftsmith started the server); returns the
    counts."""
    client = client_for(settings)
    RegenOutput(settings.out, {}, []).check(settings.data)  # before the server is even asked
    model = served_model(client, settings.model)
    convs = read_conversations(settings.data, settings.format, settings.max_samples)
    meta = endpoint_meta(settings, client, model, convs, served_dtype)
    output = RegenOutput(settings.out, meta, convs)
    done = output.resume(settings.retry_failed)
    todo = [i for i in range(len(convs)) if i not in done]
    counts = new_counts(len(convs), len(todo), COUNT_KEYS)
    bar = tqdm(total=len(todo), desc="regenerate", unit="conv", disable=settings.no_progress)
    answer = answerer(client, model["id"], settings.sampling, convs, seeded)
    start = time.perf_counter()
    with output.appending() as writer:

        def finished(i: int, result: Regenerated) -> None:
            record(writer, convs[i], i, result, counts)
            bar.update(1)

        try:
            stopped = answer_in_flight(client, settings.concurrency, iter(todo), answer, finished)
        except KeyboardInterrupt:
            stopped = None
            counts["interrupted"] = True
    bar.close()
    counts["seconds"] = time.perf_counter() - start
    output.finish(counts, tool_choice=client.tool_choice)  # raises Interrupted after Ctrl-C
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
    if not math.isfinite(settings.timeout) or settings.timeout <= 0 or settings.timeout > 86_400:
        raise UserError(f"--timeout {settings.timeout}: expected seconds per request, > 0 and at most 86400")
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
    except ServerRefused as err:
        raise UserError(str(err)) from None
    names = [str(m.get("id")) for m in models]
    if asked is None and len(names) != 1:
        raise UserError(f"--endpoint serves {len(names)} models ({', '.join(names)}): pick one with --model")
    name = asked or names[0]
    if name not in names:
        raise UserError(f"--model {name!r} is not served at {client.base}; it serves {', '.join(names)}")
    return next(m for m in models if str(m.get("id")) == name)


IDENTITY_KEYS = ("root", "parent", "meta")  # what servers say of the weights: vLLM's root, llama.cpp's meta


def endpoint_meta(
    settings: RegenerateArgs,
    client: EndpointClient,
    model: dict[str, Any],
    convs: list[Conversation],
    served_dtype: str = "float32",
) -> dict[str, Any]:
    """The meta file's settings: the served model is the target, by its id and what the server says of its
    weights, and a dtype other than float32 that `--serve` gave them (checked on resume: bfloat16's greedy
    answers are not float32's; float32 adds nothing, so files written before keep resuming); where and how it
    was asked is recorded."""
    identity = {"served_model": model["id"]} | {
        k: model[k] for k in IDENTITY_KEYS if model.get(k) is not None
    }
    if served_dtype != "float32":
        identity["dtype"] = served_dtype
    return run_meta(
        settings.sampling,
        identity,
        data_record(settings.data, settings.format, convs),
        endpoint=client.base,  # recorded, not checked on resume: a restarted server may move
        server={k: model[k] for k in ("max_model_len", "owned_by") if k in model},
        concurrency=settings.concurrency,
    )


def request_body(model: str, sampling: Sampling, conv: Conversation, index: int, seeded: bool = True) -> Any:
    """The chat-completions request for turn `turn` of conversation `index` (a function of both: a rerun,
    whatever the concurrency, asks with the same seed; no seed unless `seeded`)."""

    def body(messages: list[dict[str, Any]], turn: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if seeded:
            out["seed"] = sampling.seed * 1_000_003 + index * 1_009 + turn
        if sampling.top_k > 0:
            out["top_k"] = sampling.top_k  # vLLM, SGLang, TGI and llama.cpp take it; OpenAI does not
        if conv.tools:
            out["tools"] = openai_tools(conv.tools)
        return out

    return body


def answerer(
    client: EndpointClient, model: str, sampling: Sampling, convs: list[Conversation], seeded: bool = True
) -> Callable[[int], Regenerated]:
    """What a worker thread runs for conversation `i`: its turns one after the other, one request each."""

    def answer(i: int) -> Regenerated:
        body = request_body(model, sampling, convs[i], i, seeded)
        return regenerate_conversation(convs[i], lambda messages, turn: client.chat(body(messages, turn)))

    return answer


@dataclass
class FirstAnswer:
    """Refusals held back until the server has answered some conversation of this run: a server that refuses
    every request (a parameter it rejects, a context set too small) is the server's fault, and must not mark
    the whole dataset failed. After `limit` refusals with nothing answered, the run stops instead."""

    limit: int
    answered: bool = False
    held: list[tuple[int, Regenerated]] = field(default_factory=list)

    def verdict(self) -> ServerRefused:
        reason = self.held[-1][1].reason
        return ServerRefused(
            f"the server refused the first {len(self.held)} conversations and answered none ({reason}); this "
            "looks like the server's setting, not the conversations': nothing was marked failed; fix it"
        )


def answer_in_flight(
    client: EndpointClient,
    concurrency: int,
    todo: Iterator[int],
    answer: Callable[[int], Regenerated],
    finished: Callable[[int, Regenerated], None],
) -> Exception | None:
    """Keep `concurrency` conversations of `todo` in flight and hand each one that finishes (or whose request
    was refused for its content) to `finished`, in the order they finish. Returns why the run must stop (the
    others in flight are then ended, and nothing more is asked), or None when `todo` is done. Ctrl-C ends
    the requests in flight at once."""
    stopped: Exception | None = None
    first = FirstAnswer(limit=8)
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="regenerate")
    try:
        running: dict[Future[Regenerated], int] = {}
        while True:
            while stopped is None and len(running) < concurrency and (i := next(todo, None)) is not None:
                running[pool.submit(answer, i)] = i
            if not running:
                return stopped or (first.verdict() if first.held and not first.answered else None)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                outcome: Exception | None
                try:
                    outcome = take(first, i, future.result(), finished)
                except (ServerUnavailable, ServerRefused) as err:
                    outcome = err
                except Aborted:
                    continue  # ended because the run is stopping: not this conversation's fault
                except RequestRejected as err:  # refused for its content: this conversation fails
                    outcome = take(first, i, Regenerated(None, f"the server refused it: {err}"), finished)
                if outcome is not None and stopped is None:
                    stopped = outcome
                    client.abort()  # the others in flight end now instead of retrying
    finally:  # Ctrl-C or an error: what is written stays; the requests in flight are ended, not waited for
        client.abort()
        pool.shutdown(wait=False, cancel_futures=True)


def take(
    first: FirstAnswer, i: int, result: Regenerated, finished: Callable[[int, Regenerated], None]
) -> ServerRefused | None:
    """Hand conversation `i`'s `result` to `finished`, or hold a refusal while nothing has been answered;
    returns the error that stops the run once `first.limit` refusals are held."""
    refusal = result.messages is None and result.reason.startswith("the server refused it")
    if refusal and not first.answered:
        first.held.append((i, result))
        return first.verdict() if len(first.held) >= first.limit else None
    if result.messages is not None and not first.answered:
        first.answered = True
        for held in first.held:  # the server does answer: those refusals were the conversations' own
            finished(*held)
        first.held.clear()
    finished(i, result)
    return None


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
