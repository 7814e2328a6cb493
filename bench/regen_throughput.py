r"""Regeneration throughput: the same conversations answered by `data regenerate` here (transformers' `generate`)
and through vLLM's OpenAI-compatible server (`--endpoint`), in generated tokens per second (docs/BENCHMARKS.md,
"Regeneration through a serving engine").

    python -m bench.regen_throughput --target DIR [--conversations 40] [--max-new-tokens 128]
        [--batch-size 16] [--concurrency 1,16] [--work-dir DIR]

The first `--conversations` MT-bench questions (two user turns each, the second answered after the model's own
first answer), greedy. The seconds are `regenerate`'s own count: from the first request to the last answer,
after the model is loaded (locally) or the server answers (vLLM: its start is printed apart).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MT_BENCH = REPO.parent / "shared" / "data" / "mt_bench" / "question.jsonl"


def regen(args: argparse.Namespace, data: Path, out: Path, *how: str) -> dict:
    from draftsmith.data.regen_output import FAILED_SUFFIX, META_SUFFIX
    from draftsmith.scripts.data.regenerate import parse_args, regenerate

    out.unlink(missing_ok=True)
    for suffix in (META_SUFFIX, FAILED_SUFFIX):
        out.with_name(out.name + suffix).unlink(missing_ok=True)
    common = ["--data", str(data), "--out", str(out), "--temperature", "0", "--no-progress"]
    return regenerate(parse_args([*how, *common, "--max-new-tokens", str(args.max_new_tokens)]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="local generate: conversations per batch")
    p.add_argument("--concurrency", default="1,16", help="vLLM: conversations in flight, comma-separated")
    p.add_argument("--dtypes", default="float32,bfloat16", help="local generate: weight dtypes")
    p.add_argument("--work-dir", type=Path, default=Path("runs/bench-regen"))
    args = p.parse_args()

    from draftsmith.engines.setup import require_env
    from draftsmith.engines.vllm_server import serve

    args.work_dir.mkdir(parents=True, exist_ok=True)
    questions = [json.loads(line) for line in MT_BENCH.open()][: args.conversations]
    data = args.work_dir / "mt_bench.jsonl"
    rows = [{"messages": [{"role": "user", "content": t} for t in q["turns"]]} for q in questions]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = []
    for dtype in args.dtypes.split(","):
        counts = regen(
            args,
            data,
            args.work_dir / f"local-{dtype}.jsonl",
            "--target",
            args.target,
            "--dtype",
            dtype,
            "--batch-size",
            str(args.batch_size),
        )
        results.append((f"local generate, {dtype}", f"batch {args.batch_size}", counts))
        print(results[-1], flush=True)
    engine = require_env("vllm")
    t0 = time.perf_counter()
    with serve(engine, Path(args.target), args.work_dir / "vllm-server.log", max_model_len=4096) as server:
        print(f"vLLM server answering after {time.perf_counter() - t0:.0f} s", flush=True)
        for n in [int(c) for c in args.concurrency.split(",")]:
            out = args.work_dir / f"vllm-c{n}.jsonl"
            counts = regen(args, data, out, "--endpoint", server.url, "--concurrency", str(n))
            results.append(("vLLM server, float32", f"concurrency {n}", counts))
            print(results[-1], flush=True)
    print("\n| path | setting | conversations | answers | truncated | tokens | seconds | tokens/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for path, setting, c in results:
        rate = c["completion_tokens"] / c["seconds"]
        print(
            f"| {path} | {setting} | {c['written']} | {c['answers']} | {c['truncated']} | "
            f"{c['completion_tokens']} | {c['seconds']:.1f} | {rate:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
