"""Training throughput online vs offline, and what an fp8 feature cache costs in bytes and in tau.

    python bench/bench_train.py --target ~/.cache/draftsmith/targets/small-seed0 --out /tmp/bench-train

1. Throughput: each method's toy recipe for `--steps` optimizer steps on the same samples, online (the
   frozen target runs inside every step) and offline (features read from a cache built once). Tokens/s is
   the loop's own `perf/tokens_per_s` over the last logging window (the first window, which includes
   warm-up, is excluded); step time is `perf/step_s` of that window.
2. The bare frozen-target forward on the same micro-batches (features only, no grad): online step time /
   this forward says what training adds on top of the target.
3. Cache bytes per token, bf16 vs fp8, and EAGLE-3 trained from each cache, then measured by real
   speculative decoding on held-out prompts (tau at temperature 0).

Rows are appended to OUT/bench_train.jsonl as they finish; a rerun skips finished rows.

Feeds docs/BENCHMARKS.md, "Training throughput, online vs offline, and the fp8 feature cache".
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS: dict[str, tuple[str, str]] = {  # name: (train module, recipe)
    "medusa": ("medusa", "medusa/toy.yaml"),
    "eagle1": ("eagle", "eagle/eagle1_toy.yaml"),
    "eagle3": ("eagle", "eagle/eagle3_toy.yaml"),
    "mtp": ("mtp", "mtp/toy.yaml"),
    "distill": ("distill", "distill/toy.yaml"),
}


def _done(results: Path) -> set[str]:
    return (
        {json.loads(line)["row"] for line in results.read_text().splitlines()} if results.is_file() else set()
    )


def _emit(results: Path, row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)
    with results.open("a") as f:
        f.write(json.dumps(row) + "\n")


def _window(run: Path) -> dict[str, float]:
    from draftsmith.train.core.metrics import read_metrics

    rows = [r for r in read_metrics(run / "metrics.jsonl") if "perf/tokens_per_s" in r]
    return rows[-1]


def _cache(
    method: str, recipe: str, target: str, out: Path, storage: str, data: list[str]
) -> tuple[Path, float]:
    from draftsmith.train.cache.build import main as cache_main

    if (out / "index.json").is_file():
        return out, float("nan")
    t0 = time.perf_counter()
    cache_main(
        [
            method,
            "--config",
            str(REPO / "recipes" / recipe),
            f"target.path={target}",
            f"data.cache={out}",
            "--storage",
            storage,
            *data,
        ]
    )
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="toy target directory (small preset)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per throughput run (default 30)")
    p.add_argument("--tau-samples", type=int, default=1200, help="EAGLE-3 training samples for the tau runs")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "bench_train.jsonl"
    done = _done(results)

    import importlib

    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train.cache.store import FeatureCache
    from draftsmith.train.core.data import build_datasets, collate

    # The same samples for every run: the throughput window needs steps x micro-batch 8 of them.
    data = ["data.max_samples=400", "data.max_len=384", "data.eval_max_samples=16"]
    short = [
        f"train.max_steps={args.steps}",
        "log.every=10",
        "checkpoint.every=0",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
    ]
    caches = {
        "eagle3": _cache(
            "eagle", "eagle/eagle3_toy.yaml", args.target, args.out / "cache-eagle3", "bf16", data
        )[0],
        "mtp": _cache("mtp", "mtp/toy.yaml", args.target, args.out / "cache-mtp", "bf16", data)[0],
    }
    for name, (module_name, recipe) in METHODS.items():
        if f"throughput/{name}" in done:
            continue
        module = importlib.import_module(f"draftsmith.train.{module_name}")
        row: dict[str, Any] = {"row": f"throughput/{name}", "steps": args.steps}
        cache = caches["mtp" if name == "mtp" else "eagle3"]  # EAGLE-3's cache holds `final` too
        for mode in ("online", "offline"):
            run = args.out / f"{name}-{mode}"
            shutil.rmtree(run, ignore_errors=True)  # a run a killed benchmark left half-way
            cache_arg = [f"data.cache={cache}"] if mode == "offline" else []
            module.main(
                [
                    "--config",
                    str(REPO / "recipes" / recipe),
                    f"target.path={args.target}",
                    f"output_dir={run}",
                    *data,
                    *short,
                    *cache_arg,
                ]
            )
            w = _window(run)
            row[f"{mode}_tokens_per_s"] = w["perf/tokens_per_s"]
            row[f"{mode}_step_s"] = w["perf/step_s"]
        _emit(results, row)

    if "target_forward" not in done:
        cfg = TargetConfig(path=args.target)
        target = FrozenTarget.load(cfg)
        from draftsmith.config.loader import load_config
        from draftsmith.train.eagle import RECIPE

        eagle_recipe = load_config(
            RECIPE, REPO / "recipes" / "eagle" / "eagle3_toy.yaml", [f"target.path={args.target}", *data]
        )
        ds = build_datasets(eagle_recipe.data, target.tokenizer, seed=0, progress=False).train
        batches = [collate([ds[i] for i in range(j, j + 8)], 0) for j in range(0, 8 * 20, 8)]
        times = []
        for b in batches:
            t0 = time.perf_counter()
            target.forward(
                b["input_ids"], b["attention_mask"], layer_ids=(2, 4, 5, "final"), return_logits=True
            )
            times.append(time.perf_counter() - t0)
        step_s = sorted(times[2:])[len(times[2:]) // 2]  # median after warm-up
        _emit(
            results,
            {
                "row": "target_forward",
                "step_s": step_s,
                "micro_batch": 8,
                "tokens_per_s": sum(int(b["attention_mask"].sum()) for b in batches[2:]) / sum(times[2:]),
            },
        )

    tau_data = [f"data.max_samples={args.tau_samples}"]
    for storage in ("bf16", "fp8"):
        key = f"tau/{storage}"
        if key in done:
            continue
        cache, build_s = _cache(
            "eagle",
            "eagle/eagle3_toy.yaml",
            args.target,
            args.out / f"tau-cache-{storage}",
            storage,
            tau_data,
        )
        index = FeatureCache.open(cache, verify=False).index["splits"]
        run = args.out / f"eagle3-{storage}"
        t0 = time.perf_counter()
        reused = (run / "final").is_dir()
        if not reused:  # a finished training run is reused by a rerun
            shutil.rmtree(run, ignore_errors=True)
            importlib.import_module("draftsmith.train.eagle").main(
                [
                    "--config",
                    str(REPO / "recipes" / "eagle" / "eagle3_toy.yaml"),
                    f"target.path={args.target}",
                    f"output_dir={run}",
                    f"data.cache={cache}",
                    "checkpoint.every=0",
                    *tau_data,
                ]
            )
        train_s = None if reused else time.perf_counter() - t0
        from draftsmith.eval.acceptance import EvalArgs, evaluate
        from draftsmith.eval.drafters import load_drafter_spec

        target = FrozenTarget.load(TargetConfig(path=args.target))
        r = evaluate(
            EvalArgs(
                target=args.target,
                drafter=str(run / "final"),
                data="stdlib:heldout",
                num_prompts=args.num_prompts,
                max_new_tokens=args.max_new_tokens,
                depth=5,
                temperature=0.0,
                baseline=True,
                check_lossless=True,
                progress=False,
            ),
            target,
            load_drafter_spec(str(run / "final"), target),
        )
        train = index["train"]
        _emit(
            results,
            {
                "row": key,
                "cache_build_s": build_s,
                "train_s": train_s,
                "feature_bytes_per_token": train["feature_bytes"] / train["tokens"],
                "bytes_per_token": train["bytes"] / train["tokens"],
                "tokens": train["tokens"],
                "tau": r["tau"],
                "tau_stderr": r["tau_stderr"],
                "lossless": r["lossless"],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
