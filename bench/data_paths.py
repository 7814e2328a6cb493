r"""Training data at scale (docs/BENCHMARKS.md, "Training data at scale"): every path that labels training data
with the target, in tokens per second on the same machine.

    python -m bench.data_paths --target DIR --mix mix.jsonl [--prompts 64] [--max-new-tokens 128]
        [--batch-sizes 16,64] [--dtypes float32,bfloat16] [--answers-per-prompt 4] [--prefill-samples 400]
        [--vllm-concurrency 16,64] [--work-dir DIR] [--paths prefill,local,sampled,server]

Paths (the tokens counted are the ones a drafter trains on):
  1. the target's own answers, locally (`data regenerate --target`, transformers' generate): greedy, per dtype
     and batch size; tokens = generated tokens;
  2. several sampled answers per prompt (T = 0.8, `--seed 0..K-1`, one run per seed, the K files mixed with
     `data mix`, which drops repeated answers): tokens = generated tokens, and how many answers were distinct;
  3. the same answers through vLLM's OpenAI-compatible server (`--endpoint`, both cores), per concurrency;
  4. prefill only: the target's features and greedy labels over text that is already written (`draftsmith
     cache` with `draft.labels=top1` on the first --prefill-samples of a `data mix` file), per dtype; tokens =
     every token of the samples, each one a training position.
Prompts: the first --prompts ShareGPT first turns of ../shared/data (one user turn each). Each path's seconds
are its own work after the model is loaded (regenerate's own count; the cache's wall time less its start).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.regen_throughput import regen
from draftsmith.runtime.display import table as md_table

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt_prompts" / "ShareGPT_V3_filtered_1000.json"
RECIPE = REPO / "recipes" / "eagle" / "eagle3_smollm2_scale.yaml"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.data_paths",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", required=True, help="the SmolLM2 directory")
    p.add_argument("--mix", type=Path, required=True, help="a `draftsmith data mix` file (the prefill path)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="16,64")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--answers-per-prompt", type=int, default=4)
    p.add_argument("--prefill-samples", type=int, default=400)
    p.add_argument("--vllm-concurrency", default="16,64", help="'' to skip the vLLM server")
    p.add_argument("--work-dir", type=Path, default=Path("runs/bench-data-paths"))
    p.add_argument(
        "--paths",
        default="prefill,local,sampled,server",
        help="which paths to measure (comma-separated); each run's rows are kept in WORK_DIR/rows.jsonl and "
        "the table shows every path measured there",
    )
    return p


def prompts_file(args: argparse.Namespace) -> Path:
    records = json.loads(SHAREGPT.read_text())[: args.prompts]
    rows = [{"messages": [{"role": "user", "content": r["conversations"][0]["value"]}]} for r in records]
    path = args.work_dir / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def local(args: argparse.Namespace, data: Path) -> list[dict[str, Any]]:
    rows = []
    for dtype in args.dtypes.split(","):
        for batch in args.batch_sizes.split(","):
            out = args.work_dir / f"local-{dtype}-b{batch}.jsonl"
            c = regen(args, data, out, "--target", args.target, "--dtype", dtype, "--batch-size", batch)
            rows.append(
                row(
                    f"answers, local, {dtype}", f"batch {batch}, greedy", c["completion_tokens"], c["seconds"]
                )
            )
            print(rows[-1], flush=True)
    return rows


def sampled(args: argparse.Namespace, data: Path) -> list[dict[str, Any]]:
    """K sampled answers per prompt (one run per seed, bfloat16 where native, the largest batch), then mixed."""
    from draftsmith.runtime.hardware import native_bfloat16
    from draftsmith.scripts.data.regenerate import parse_args, regenerate

    dtype = "bfloat16" if native_bfloat16() else "float32"
    batch = args.batch_sizes.split(",")[-1]
    tokens, seconds, files = 0, 0.0, []
    for seed in range(args.answers_per_prompt):
        out = args.work_dir / f"sampled-s{seed}.jsonl"
        for suffix in ("", ".meta.json", ".failed.jsonl"):
            Path(f"{out}{suffix}").unlink(missing_ok=True)
        c = regenerate(
            parse_args(
                [
                    *("--target", args.target, "--data", str(data), "--out", str(out)),
                    *("--temperature", "0.8", "--seed", str(seed), "--dtype", dtype, "--batch-size", batch),
                    *("--max-new-tokens", str(args.max_new_tokens), "--no-progress"),
                ]
            )
        )
        tokens += c["completion_tokens"]
        seconds += c["seconds"]
        files.append(str(out))
    mixed = args.work_dir / "sampled-mix.jsonl"
    subprocess.run(
        [sys.executable, "-m", "draftsmith.scripts.cli", "data", "mix", *files, "--out", str(mixed)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    distinct = json.loads(Path(f"{mixed}.meta.json").read_text())["records"]
    setting = f"{args.answers_per_prompt} per prompt, T = 0.8, {dtype}, batch {batch}"
    note = f"{distinct} of {args.answers_per_prompt * args.prompts} answers distinct"
    return [row("answers, local, sampled", setting, tokens, seconds, note)]


def server(args: argparse.Namespace, data: Path) -> list[dict[str, Any]]:
    from draftsmith.engines.setup import require_env
    from draftsmith.engines.vllm_server import serve

    rows = []
    engine = require_env("vllm")
    with serve(engine, Path(args.target), args.work_dir / "vllm-server.log", max_model_len=4096) as srv:
        for n in args.vllm_concurrency.split(","):
            c = regen(
                args, data, args.work_dir / f"vllm-c{n}.jsonl", "--endpoint", srv.url, "--concurrency", n
            )
            rows.append(
                row("answers, vLLM server, float32", f"concurrency {n}", c["completion_tokens"], c["seconds"])
            )
            print(rows[-1], flush=True)
    return rows


def prefill(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`draftsmith cache` of the mix's first samples: features at EAGLE-3's taps and the target's greedy token."""
    rows = []
    for dtype in args.dtypes.split(","):
        cache = args.work_dir / f"cache-{dtype}"
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        cmd = [
            *(sys.executable, "-m", "draftsmith.scripts.cli", "cache", "eagle", "--config", str(RECIPE)),
            *(f"target.path={args.target}", f"target.dtype={dtype}", f"data.train=[{args.mix}]"),
            *(f"data.max_samples={args.prefill_samples}", "data.eval_fraction=0", f"data.cache={cache}"),
            *("--batch-size", "16"),
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        index = json.loads((cache / "index.json").read_text())
        tokens = index["splits"]["train"]["tokens"]
        start = startup_seconds(args, dtype)
        rows.append(
            row(f"prefill (features + top1), {dtype}", "batch 16, length-sorted", tokens, wall - start)
        )
        print(rows[-1], flush=True)
    return rows


def startup_seconds(args: argparse.Namespace, dtype: str) -> float:
    """The cache command's fixed cost (imports, the target's load, rendering one sample), to subtract."""
    cache = args.work_dir / f"cache-start-{dtype}"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    cmd = [
        *(sys.executable, "-m", "draftsmith.scripts.cli", "cache", "eagle", "--config", str(RECIPE)),
        *(f"target.path={args.target}", f"target.dtype={dtype}", f"data.train=[{args.mix}]"),
        *("data.max_samples=1", "data.eval_fraction=0", f"data.cache={cache}"),
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def row(path: str, setting: str, tokens: int, seconds: float, note: str = "") -> dict[str, Any]:
    return {"path": path, "setting": setting, "tokens": tokens, "seconds": seconds, "note": note}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = prompts_file(args)
    chosen = set(args.paths.split(","))
    measure = {"prefill": lambda: prefill(args), "local": lambda: local(args, data)}
    measure |= {"sampled": lambda: sampled(args, data), "server": lambda: server(args, data)}
    unknown = chosen - set(measure)
    if unknown:
        raise SystemExit(f"--paths: unknown {sorted(unknown)}; choose from {sorted(measure)}")
    kept = args.work_dir / "rows.jsonl"
    for name in measure:
        if name in chosen and (name != "server" or args.vllm_concurrency):
            with kept.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in measure[name]())
    rows = [json.loads(line) for line in kept.open()] if kept.is_file() else []
    cells = []
    for r in rows:
        rate = r["tokens"] / r["seconds"]
        cells.append(
            [r["path"], r["setting"], f"{r['tokens']:,}", f"{r['seconds']:.1f}", f"{rate:,.0f}"]
            + [f"{2_000_000 / rate / 60:.0f} min", r["note"]]
        )
    header = ["path", "setting", "tokens", "seconds", "tokens/s", "2M tokens take", "note"]
    text = "\n".join(md_table(header, cells))
    (args.work_dir / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
