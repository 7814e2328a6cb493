r"""Regeneration throughput: the same conversations answered by `data regenerate` here (transformers' `generate`)
and through vLLM's OpenAI-compatible server (`--endpoint`), in generated tokens per second (docs/BENCHMARKS.md,
"Regeneration: `data regenerate` here against `--endpoint`").

    python -m bench.regen_throughput --target DIR [--conversations 40] [--max-new-tokens 128]
        [--batch-size 16] [--concurrency 1,16] [--bindings draftsmith,auto] [--data FILE] [--work-dir DIR]

The first `--conversations` MT-bench questions (two user turns each, the second answered after the model's own
first answer), or of `--data` (any format `data regenerate` reads), greedy. The seconds are `regenerate`'s own
count: from the first request to the last answer, after the model is loaded (locally) or the server answers
(vLLM: its start is printed apart). The server runs once per `--bindings` entry: `draftsmith` is the binding
draftsmith's workers apply (engines/vllm_engine.py `omp_binding`: every core of a 2-core machine), `auto` vLLM's
own (a core kept for its scheduler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from draftsmith.runtime.display import table as md_table

REPO = Path(__file__).resolve().parents[1]
MT_BENCH = REPO.parent / "shared" / "data" / "mt_bench" / "question.jsonl"


def regen(args: argparse.Namespace, data: Path, out: Path, *how: str) -> dict:
    from draftsmith.data.regen_output import FAILED_SUFFIX, META_SUFFIX
    from draftsmith.scripts.data.regenerate import parse_args, regenerate

    out.unlink(missing_ok=True)
    for suffix in (META_SUFFIX, FAILED_SUFFIX):
        out.with_name(out.name + suffix).unlink(missing_ok=True)
    common = ["--data", str(data), "--out", str(out), "--temperature", "0", "--no-progress"]
    common += ["--max-samples", str(args.conversations)]
    return regenerate(parse_args([*how, *common, "--max-new-tokens", str(args.max_new_tokens)]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="local generate: conversations per batch")
    p.add_argument("--concurrency", default="1,16", help="vLLM: conversations in flight, comma-separated")
    p.add_argument("--dtypes", default="float32,bfloat16", help="local generate: weight dtypes ('' for none)")
    p.add_argument("--bindings", default="draftsmith", help="vLLM: OpenMP bindings, draftsmith and/or auto")
    p.add_argument("--data", type=Path, help="conversations to answer (default: MT-bench's questions)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/bench-regen"))
    args = p.parse_args()

    from draftsmith.engines.setup import require_env
    from draftsmith.engines.vllm_engine import omp_binding
    from draftsmith.engines.vllm_server import serve

    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data is None:  # MT-bench's two turns as one conversation each
        data = args.work_dir / "mt_bench.jsonl"
        questions = [json.loads(line) for line in MT_BENCH.open()][: args.conversations]
        rows = [{"messages": [{"role": "user", "content": t} for t in q["turns"]]} for q in questions]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = []
    for dtype in filter(None, args.dtypes.split(",")):
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
    for binding in args.bindings.split(","):
        if binding == "auto":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
        else:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        cores = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or omp_binding() or "auto"
        t0 = time.perf_counter()
        log = args.work_dir / f"vllm-server-{binding}.log"
        with serve(engine, Path(args.target), log, max_model_len=4096) as server:
            print(f"vLLM server ({binding}) answering after {time.perf_counter() - t0:.0f} s", flush=True)
            for n in [int(c) for c in args.concurrency.split(",")]:
                out = args.work_dir / f"vllm-{binding}-c{n}.jsonl"
                counts = regen(args, data, out, "--endpoint", server.url, "--concurrency", str(n))
                results.append((f"vLLM server, float32, OpenMP on {cores}", f"concurrency {n}", counts))
                print(results[-1], flush=True)
    header = ["path", "setting", "conversations", "answers", "truncated", "tokens", "seconds", "tokens/s"]
    cells = [
        [
            path,
            setting,
            c["written"],
            c["answers"],
            c["truncated"],
            c["completion_tokens"],
            f"{c['seconds']:.1f}",
        ]
        + [f"{c['completion_tokens'] / c['seconds']:.0f}"]
        for path, setting, c in results
    ]
    print("\n" + "\n".join(md_table(header, cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
