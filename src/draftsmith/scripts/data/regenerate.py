"""Regenerate the assistant turns of a conversation dataset with the target (self-distillation data).

    draftsmith data regenerate --target DIR --data SRC --out regenerated.jsonl [--temperature 0.8] ...
    python scripts/data/regenerate.py ...   (the same)

A drafter is deployed against the target's own answers, not the dataset's: training on what the target
writes (sequence-level KD, Medusa-2's self-distillation, EAGLE-3's regenerated data) removes that shift.
Every user turn gets a fresh answer conditioned on the target's own earlier answers, generated in batches
by transformers' `generate` (KV cache, left padding). The output is `messages` JSONL that every recipe reads
(`data.train=[regenerated.jsonl]`), one record per input conversation with its input `index`.

With `--endpoint URL` the answers come from an OpenAI-compatible chat-completions server instead (vLLM,
SGLang, TGI, llama.cpp), `--concurrency` conversations in flight: the way to regenerate 100k+ conversations.
Tool calls survive it: the tools are passed to the server, the model's calls are kept (OpenAI `tool_calls`, or
the text the model wrote when the server parses none), and a recorded tool result is kept where the model made
the recorded call (otherwise the conversation ends at the model's own call). A reasoning server's
`reasoning_content` is kept on the answer, where the target's chat template renders it. A server that stops
answering stops the run (after --retries) without marking anything failed.
(scripts/data/regenerate_endpoint.py, data/endpoint.py)

Resumable: rows already in OUT (or in OUT.failed.jsonl) are skipped, so an interrupted run continues where
it stopped; a half-written last line is dropped first. The sampling settings, the target's identity and
the counts are stored in OUT.meta.json; resuming with other settings is refused. The counts add up:
written + failed + skipped = input. A failure (no user turn, tool messages, a prompt too long for the
target, a request the server refused) is recorded in OUT.failed.jsonl with its reason, never silently
dropped. Besides those counts, the answers, the answers cut at --max-new-tokens (truncated) and the tokens
are printed and stored.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from draftsmith.runtime.errors import UserError, run_main
from draftsmith.runtime.tokens import left_pad

META_SUFFIX = ".meta.json"
FAILED_SUFFIX = ".failed.jsonl"


@dataclass(frozen=True)
class Sampling:
    """What was asked of the target; stored next to the output and checked on resume."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith data regenerate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", help="target model: local directory or Hugging Face Hub id (local generation)")
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
        "--concurrency", type=int, default=16, help="--endpoint: conversations in flight (default 16)"
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="--endpoint: seconds per request (default 600)"
    )
    p.add_argument(
        "--retries",
        type=int,
        default=4,
        help="--endpoint: retries of a request the server did not answer (unreachable, timeout, 408, 429, 5xx), "
        "with exponential backoff (default 4); then the run stops, and a rerun continues",
    )
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
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each batch derives its own)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="the target's weights while generating (default auto: bfloat16 on GPU, float32 on CPU; bfloat16 "
        "generated 2.1x as fast on a CPU with native bfloat16, e.g. AVX512-BF16 or AMX: docs/BENCHMARKS.md)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def read_done(out: Path) -> set[int]:
    """Input indices already in `out` (dropping a half-written last line, which a killed run leaves)."""
    done: set[int] = set()
    if not out.is_file():
        return done
    raw = out.read_bytes()
    good = raw[: raw.rfind(b"\n") + 1]
    if len(good) != len(raw):
        out.write_bytes(good)
    for k, line in enumerate(good.decode().splitlines()):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{out}:{k + 1} is not a regenerate row ({err}); pass a new --out or delete the file"
            ) from None
    return done


def check_meta(path: Path, meta: dict[str, Any]) -> None:
    """Refuse to resume a file written with other settings (it would mix two data distributions)."""
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for key in ("sampling", "target", "data"):
        if old.get(key) != meta[key]:
            raise ValueError(
                f"{path} was written with {key} {old.get(key)} but this run has {meta[key]}; resume with the "
                "same settings, or pass a new --out"
            )


def generate_batch(
    model: Any, tokenizer: Any, prompts: list[list[int]], sampling: Sampling, stop_ids: set[int]
) -> list[tuple[list[int], bool]]:
    """New token ids for each prompt (the stop token and what follows cut off), left-padded in one batch, and
    whether a stop token ended it (False: cut at max_new_tokens)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids)
    ids, mask = left_pad(prompts, pad, model.device)
    width = ids.shape[1]
    greedy = sampling.temperature == 0
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=sampling.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p,
        top_k=None if greedy else (sampling.top_k or None),
        pad_token_id=pad,
        eos_token_id=sorted(stop_ids),
    )
    answers = []
    for row in out[:, width:].tolist():
        cut = next((k for k, t in enumerate(row) if t in stop_ids), None)
        answers.append((row[:cut], cut is not None))
    return answers


def regenerate(args: argparse.Namespace) -> dict[str, Any]:
    """Run the regeneration `args` describe; returns the counts (written, failed, skipped, input; answers,
    truncated, completion_tokens, seconds)."""
    sampling = Sampling(args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.seed)
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.max_new_tokens < 1:
        raise UserError("need --temperature >= 0, 0 < --top-p <= 1 and --max-new-tokens >= 1")
    if (args.target is None) == (args.endpoint is None):
        raise UserError("pass --target DIR (generate here) or --endpoint URL (a serving engine), not both")
    if args.endpoint is not None:
        if args.concurrency < 1 or args.retries < 0 or args.timeout <= 0:
            raise UserError("need --concurrency >= 1, --retries >= 0 and --timeout > 0")
        from .regenerate_endpoint import regenerate_via_endpoint

        return regenerate_via_endpoint(args, sampling)
    return regenerate_locally(args, sampling)


def regenerate_locally(args: argparse.Namespace, sampling: Sampling) -> dict[str, Any]:
    """Regenerate with transformers' `generate` on this machine."""
    from transformers import GenerationConfig

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations, with_answers
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids

    convs = read_conversations(args.data, args.format, args.max_samples)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target = FrozenTarget.load(TargetConfig(path=args.target, dtype=args.dtype), device)
    model, tokenizer = target.model, target.tokenizer
    model.generation_config = GenerationConfig()  # only the settings passed below, never a repo's defaults
    stop_ids = stop_token_ids(target)
    if not stop_ids:
        raise ValueError(
            f"target {args.target!r} has no end-of-sequence token (tokenizer eos_token_id or generation_config "
            "eos_token_id): answers would never end; set one in the target's generation_config.json"
        )
    max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    meta: dict[str, Any] = {
        "sampling": asdict(sampling),
        "target": target.identity(),
        "data": {"source": args.data, "format": args.format},  # --max-samples may grow on resume
        "dtype": str(target.model.dtype).removeprefix("torch."),  # recorded, not checked on resume
    }
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = out.with_name(out.name + META_SUFFIX)
    failed_path = out.with_name(out.name + FAILED_SUFFIX)
    check_meta(meta_path, meta)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")  # before any row: a resumed run is checked
    done = read_done(out) | read_done(failed_path)
    todo = [i for i in range(len(convs)) if i not in done]
    counts: dict[str, Any] = {
        "input": len(convs),
        "written": 0,
        "failed": 0,
        "skipped": len(convs) - len(todo),
    }
    counts |= {"answers": 0, "truncated": 0, "completion_tokens": 0}
    began = time.perf_counter()
    bar = tqdm(total=len(todo), desc="regenerate", unit="conv", disable=args.no_progress)
    with out.open("a") as rows, failed_path.open("a") as failures:
        for start in range(0, len(todo), args.batch_size):
            batch = todo[start : start + args.batch_size]
            prompts = {i: prompt_turns(convs[i]) for i in batch}
            answers: dict[int, list[str]] = {i: [] for i in batch}
            lengths = dict.fromkeys(batch, (0, 0))  # tokens generated, answers cut at --max-new-tokens
            failed: dict[int, str] = {}
            for i in batch:
                if not prompts[i]:
                    failed[i] = "no user turn (a text document or an assistant-only record)"
                elif any(m["role"] == "tool" for m in convs[i].messages):
                    failed[i] = "has tool messages: their results cannot be regenerated"
            torch.manual_seed(args.seed * 1_000_003 + batch[0])  # a resumed run redraws the same batch
            for turn in range(max((len(p) for p in prompts.values()), default=0)):
                live, ids = [], []
                for i in batch:
                    if i in failed or turn >= len(prompts[i]):
                        continue
                    messages = with_answers(prompts[i][turn], answers[i])
                    p = render_prompt(tokenizer, messages, convs[i].tools)
                    if len(p) + sampling.max_new_tokens > max_positions:
                        failed[i] = (
                            f"prompt of {len(p)} tokens + {sampling.max_new_tokens} new > {max_positions}"
                        )
                        continue
                    live.append(i)
                    ids.append(p)
                if not live:
                    continue
                with torch.no_grad():
                    new = generate_batch(model, tokenizer, ids, sampling, stop_ids)
                for i, (tokens, stopped) in zip(live, new, strict=True):
                    answers[i].append(tokenizer.decode(tokens, skip_special_tokens=True).strip())
                    lengths[i] = (lengths[i][0] + len(tokens), lengths[i][1] + (not stopped))
            for i in batch:
                if i in failed:
                    failures.write(
                        json.dumps({"index": i, "source": convs[i].source, "reason": failed[i]}) + "\n"
                    )
                    counts["failed"] += 1
                    continue
                messages = with_answers(prompts[i][-1], answers[i][:-1])
                messages.append({"role": "assistant", "content": answers[i][-1]})
                record: dict[str, Any] = {"index": i, "messages": messages}
                if convs[i].tools:
                    record["tools"] = convs[i].tools
                if convs[i].category:
                    record["category"] = convs[i].category
                rows.write(json.dumps(record, ensure_ascii=False) + "\n")
                counts["written"] += 1
                counts["answers"] += len(answers[i])
                counts["completion_tokens"] += lengths[i][0]
                counts["truncated"] += lengths[i][1]
            rows.flush()
            failures.flush()
            bar.update(len(batch))
    bar.close()
    assert counts["written"] + counts["failed"] + counts["skipped"] == counts["input"]
    counts["seconds"] = time.perf_counter() - began
    meta["counts"] = counts
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
