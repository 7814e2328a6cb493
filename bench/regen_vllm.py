r"""The target's own answers in bulk through vLLM's server on this machine (docs/BENCHMARKS.md, "Scaling"):
draftsmith's vLLM venv serves the target (`draftsmith engine-setup vllm`), and `data regenerate --endpoint`
answers the conversations with --concurrency requests in flight.

    python -m bench.regen_vllm --target DIR --data prompts.jsonl --out answers.jsonl \
        [--concurrency 64] [--max-new-tokens 256] [--max-samples N] [--temperature 0] [--seed 0]

Resumable as `data regenerate` is: rerun the same command and it goes on where it stopped. The server's log is
OUT.vllm.log; the counts (answers, tokens, seconds after the server answered) are printed and kept in
OUT.meta.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.regen_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", type=Path, required=True, help="the target directory")
    p.add_argument("--data", required=True, help="conversations whose assistant turns are regenerated")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM's context (prompt + answer)")
    args = p.parse_args(argv)

    from draftsmith.engines.setup import require_env
    from draftsmith.engines.vllm_server import serve
    from draftsmith.scripts.data.regenerate import parse_args, regenerate

    engine = require_env("vllm")
    t0 = time.perf_counter()
    log = args.out.with_name(args.out.name + ".vllm.log")
    with serve(engine, args.target, log, max_model_len=args.max_model_len) as server:
        print(f"vLLM's server answers after {time.perf_counter() - t0:.0f} s", flush=True)
        flags = [
            *("--endpoint", server.url, "--data", args.data, "--out", str(args.out)),
            *("--concurrency", str(args.concurrency), "--max-new-tokens", str(args.max_new_tokens)),
            *("--temperature", str(args.temperature), "--seed", str(args.seed)),
            *(("--max-samples", str(args.max_samples)) if args.max_samples else ()),
        ]
        counts = regenerate(parse_args(flags))
    rate = counts["completion_tokens"] / counts["seconds"] if counts["seconds"] else 0.0
    print(
        f"{counts['completion_tokens']:,} tokens in {counts['seconds']:.0f} s: {rate:.0f} tokens/s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
