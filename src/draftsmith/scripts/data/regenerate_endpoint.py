"""`draftsmith data regenerate --endpoint URL`: the same regeneration, through the server that serves the target.

Up to `--concurrency` conversations are in flight, one request each (a conversation's turns go one after the
other: each is conditioned on the model's own earlier answers). A finished conversation is appended to OUT at
once, in the order they finish, with its input `index`; so a killed run loses at most the conversations in
flight, and a rerun skips what OUT (and OUT.failed.jsonl) already hold. When the server stops answering, the
run stops too, after the retries, and says how far it got: nothing is marked failed for a server that is down.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from draftsmith.data.conversations import Conversation, read_conversations
from draftsmith.data.endpoint import (
    EndpointClient,
    Regenerated,
    Reply,
    api_base,
    openai_tools,
    regenerate_conversation,
)
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.http import RequestRejected, ServerUnavailable

from .regenerate import FAILED_SUFFIX, META_SUFFIX, Sampling, check_meta, read_done

COUNT_KEYS = ("answers", "truncated", "tool_call_differs", "prompt_tokens", "completion_tokens")


def client_for(args: argparse.Namespace) -> EndpointClient:
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise UserError(
                f"--api-key-env {args.api_key_env}: that environment variable is not set or empty"
            )
    return EndpointClient(api_base(args.endpoint), key, args.timeout, args.retries)


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


def regenerate_via_endpoint(args: argparse.Namespace, sampling: Sampling) -> dict[str, Any]:
    """Run the regeneration `args` describe through `args.endpoint`; returns the counts."""
    client = client_for(args)
    model = served_model(client, args.model)
    convs = read_conversations(args.data, args.format, args.max_samples)
    meta: dict[str, Any] = {
        "sampling": asdict(sampling),
        "target": {"served_model": model["id"]},
        "data": {"source": args.data, "format": args.format},
        "endpoint": client.base,  # recorded, not checked on resume: a restarted server may move
        "server": {k: model[k] for k in ("root", "max_model_len", "owned_by") if k in model},
        "concurrency": args.concurrency,
    }
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = out.with_name(out.name + META_SUFFIX)
    failed_path = out.with_name(out.name + FAILED_SUFFIX)
    check_meta(meta_path, meta)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    done = read_done(out) | read_done(failed_path)
    todo = iter([i for i in range(len(convs)) if i not in done])
    counts: dict[str, Any] = {"input": len(convs), "written": 0, "failed": 0}
    counts["skipped"] = len(done & set(range(len(convs))))
    counts |= dict.fromkeys(COUNT_KEYS, 0)
    bar = tqdm(total=len(convs) - counts["skipped"], desc="regenerate", unit="conv", disable=args.no_progress)

    def work(i: int) -> Regenerated:
        body = request_body(model["id"], sampling, convs[i], i)

        def ask(messages: list[dict[str, Any]], turn: int) -> Reply:
            return client.chat(body(messages, turn))

        return regenerate_conversation(convs[i], ask)

    stopped: ServerUnavailable | None = None
    start = time.perf_counter()
    pool = ThreadPoolExecutor(args.concurrency, thread_name_prefix="regenerate")
    try:
        with out.open("a") as rows, failed_path.open("a") as failures:
            running: dict[Future[Regenerated], int] = {}
            while True:
                while (
                    stopped is None
                    and len(running) < args.concurrency
                    and (i := next(todo, None)) is not None
                ):
                    running[pool.submit(work, i)] = i
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    try:
                        result = future.result()
                    except ServerUnavailable as err:
                        stopped = stopped or err
                        client.stop.set()  # the others in flight give up instead of retrying
                        continue
                    except RequestRejected as err:  # this conversation's request was refused: recorded
                        result = Regenerated(None, str(err))
                    write(rows, failures, convs[i], i, result, counts)
                    bar.update(1)
    finally:  # Ctrl-C or an error: what is written stays; the requests in flight are not waited for
        client.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
    bar.close()
    counts["seconds"] = time.perf_counter() - start
    meta["counts"] = counts
    meta["tool_choice"] = client.tool_choice
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    if stopped is not None:
        raise UserError(
            f"{stopped}; {counts['written']} conversations written and {counts['failed']} failed this run, "
            f"{counts['skipped']} were done before: rerun the same command to continue"
        )
    assert counts["written"] + counts["failed"] + counts["skipped"] == counts["input"]
    return counts


def write(
    rows: Any, failures: Any, conv: Conversation, i: int, result: Regenerated, counts: dict[str, Any]
) -> None:
    """Append one finished conversation (or its failure) and count it; flushed at once."""
    if result.messages is None:
        failures.write(json.dumps({"index": i, "source": conv.source, "reason": result.reason}) + "\n")
        failures.flush()
        counts["failed"] += 1
        return
    record: dict[str, Any] = {"index": i, "messages": result.messages}
    if conv.tools:
        record["tools"] = conv.tools
    if conv.category:
        record["category"] = conv.category
    rows.write(json.dumps(record, ensure_ascii=False) + "\n")
    rows.flush()
    counts["written"] += 1
    for key in COUNT_KEYS:
        counts[key] += int(getattr(result, key))
