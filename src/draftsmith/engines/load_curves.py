"""Where speculation stops paying: vLLM's tokens/s with and without the drafter as concurrency and context grow.

A drafter that doubles one request's speed can slow a busy server down: verification spends compute that batching
would otherwise use, and a long context makes each verified token dearer. `engine-eval --concurrency 1,2,4,8`
and `--context-lengths 1024,4096` measure it as operators see it: vLLM's OpenAI-compatible server (the engine's
own scheduler, requests arriving while others run) serves the target twice, plainly and with the drafter, and
`c` client threads keep `c` requests in flight over the same prompts. Each level reports both servers' tokens/s
(completion tokens over the level's wall time), the speedup, and vLLM's mean acceptance length from its
Prometheus counters; the first level whose speedup is below 1 is where to switch speculation off.

The long prompts are real text, not padding: documents of `--context-data` (default `--data`) joined and cut
to fill the length, rendered with the target's chat template as one user turn asking for a summary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.data.conversations import read_conversations
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.http import HttpClient, RequestRejected, ServerUnavailable

from .setup import EngineEnv
from .vllm_server import serve

QUESTION = "Summarize the text above in three sentences."
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")


@dataclass(frozen=True)
class Level:
    """One point of a curve: `prompts` decoded with `concurrency` requests in flight."""

    name: str  # "concurrency" or "context_tokens"
    value: int
    prompts: list[list[int]]
    concurrency: int


def documents_text(source: str) -> list[str]:
    """The documents of a data source as text: a text record as it is, a chat as its messages' contents."""
    docs = []
    for conv in read_conversations(source):
        text = conv.text if conv.text is not None else "\n\n".join(str(m["content"]) for m in conv.messages)
        if text.strip():
            docs.append(text.strip())
    return docs


def long_prompts(tokenizer: Any, documents: Sequence[str], length: int, count: int) -> list[list[int]]:
    """`count` prompts of at most `length` tokens (within a few of it), each the documents from the k-th on
    joined and cut to fill the length, then QUESTION, rendered as one user turn with the generation prompt."""
    # chat_render imports transformers: here rather than at the top, so `engine-eval --help` stays fast
    from draftsmith.data.chat_render import render_prompt

    overhead = len(render_prompt(tokenizer, [{"role": "user", "content": f"\n\n{QUESTION}"}], None))
    if length <= overhead + 8:
        raise UserError(
            f"--context-lengths {length}: the chat template and question alone take {overhead} tokens"
        )
    encoded: dict[int, list[int]] = {}  # each document tokenized once, for all the prompts that use it
    prompts = []
    for k in range(count):
        stream: list[int] = []
        for j in range(len(documents)):
            d = (k + j) % len(documents)
            if d not in encoded:
                encoded[d] = tokenizer.encode(documents[d] + "\n\n", add_special_tokens=False)
            stream += encoded[d]
            if len(stream) >= length:
                break
        if len(stream) < length - overhead:
            raise UserError(
                f"--context-lengths {length}: the documents hold {len(stream)} tokens in all; pass more text with "
                "--context-data"
            )
        budget = length - overhead
        for _ in range(8):  # re-tokenizing the cut text can differ by a few tokens: shrink until it fits
            text = tokenizer.decode(stream[:budget], skip_special_tokens=True)
            ids = render_prompt(tokenizer, [{"role": "user", "content": f"{text}\n\n{QUESTION}"}], None)
            if len(ids) <= length:
                break
            budget -= len(ids) - length
        prompts.append(ids)
    return prompts


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's speculative counters from its Prometheus endpoint (`{root}/metrics`), summed over label sets."""
    root = url.removesuffix("/v1")
    return parse_counters(HttpClient(root, timeout_s=30, retries=0).get_text("/metrics"))


def parse_counters(text: str) -> dict[str, float]:
    """SPEC_COUNTERS from Prometheus' text format (`name_total{labels} value` lines), summed over label sets."""
    out = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
        if name in out and not line.startswith("#"):
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def measure(client: HttpClient, model: str, level: Level, job: dict[str, Any]) -> dict[str, Any]:
    """Decode the level's prompts with `level.concurrency` requests in flight; tokens, seconds, tokens/s."""

    def one(ids: list[int]) -> int:
        body = {
            "model": model,
            "prompt": ids,
            "max_tokens": job["max_tokens"],
            "temperature": job["temperature"],
            "stop_token_ids": job["stop_token_ids"],
        }
        return int(client.request("POST", "/completions", body)["usage"]["completion_tokens"])

    before = spec_counters(client.base)
    start = time.perf_counter()
    with ThreadPoolExecutor(level.concurrency) as pool:
        tokens = sum(pool.map(one, level.prompts))
    seconds = time.perf_counter() - start
    after = spec_counters(client.base)
    drafts = after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]
    accepted = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }


def run_server(
    engine: EngineEnv, job: dict[str, Any], levels: Sequence[Level], log: Path, progress: bool
) -> list[dict[str, Any]]:
    """Serve the target (with `job["speculative_config"]` unless None) and measure every level."""
    extra = []
    if job["speculative_config"] is not None:
        extra = ["--speculative-config", json.dumps(job["speculative_config"])]
    if job.get("trust_remote_code"):
        extra.append("--trust-remote-code")
    length = job["max_model_len"]
    eager = job["enforce_eager"]
    with serve(
        engine, Path(job["model"]), log, max_model_len=length, extra=extra, enforce_eager=eager
    ) as server:
        client = HttpClient(server.url, timeout_s=1800, retries=0)
        kind = "speculative" if job["speculative_config"] else "plain"
        out = []
        try:
            measure(client, "target", Level("warm-up", 0, levels[0].prompts[:1], 1), job | {"max_tokens": 8})
            for level in levels:
                out.append(measure(client, "target", level, job))
                if progress:
                    rate = out[-1]["tokens_per_s"]
                    print(f"vLLM server, {kind}: {level.name} {level.value}: {rate:.1f} tokens/s", flush=True)
        except (ServerUnavailable, RequestRejected) as err:
            raise UserError(f"vLLM's {kind} server failed a request: {err} (log: {log})") from None
        return out


def curves(
    engine: EngineEnv,
    plain_job: dict[str, Any],
    spec_job: dict[str, Any],
    levels: Sequence[Level],
    work: Path,
    progress: bool,
) -> dict[str, Any]:
    """`{"concurrency": rows, "context_tokens": rows, "stops_paying": {...}}` over `levels`."""
    plain = run_server(engine, plain_job, levels, work / "vllm-server-plain.log", progress)
    spec = run_server(engine, spec_job, levels, work / "vllm-server-speculative.log", progress)
    out: dict[str, Any] = {}
    for level, p, s in zip(levels, plain, spec, strict=True):
        out.setdefault(level.name, []).append(
            {
                level.name: level.value,
                "concurrency": level.concurrency,
                "requests": len(level.prompts),
                "prompt_tokens": sum(map(len, level.prompts)) / len(level.prompts),
                "plain_tokens_per_s": p["tokens_per_s"],
                "spec_tokens_per_s": s["tokens_per_s"],
                "speedup": s["tokens_per_s"] / p["tokens_per_s"],
                "mean_acceptance_length": s["mean_acceptance_length"],
                "tokens": {"plain": p["tokens"], "speculative": s["tokens"]},
            }
        )
    out["stops_paying"] = {
        name: stops_paying(out[name], name) for name in ("concurrency", "context_tokens") if name in out
    }
    return out


def stops_paying(rows: Sequence[dict[str, Any]], name: str) -> int | None:
    """The first level (in increasing order) from which speculation is slower than plain decoding for good:
    every level from it on has a speedup below 1. None when the last level still pays."""
    first = None
    for row in sorted(rows, key=lambda r: r[name]):
        paying = row["speedup"] >= 1
        first = None if paying else (row[name] if first is None else first)
    return first
