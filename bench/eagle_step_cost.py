r"""Where an EAGLE-3 training step's time goes on SmolLM2 (docs/BENCHMARKS.md, "A real target" and "The
quickstart on SmolLM2-135M-Instruct"):

    python -m bench.eagle_step_cost --target DIR --data a.jsonl,b.jsonl [--cache DIR] [--steps 6]
        [--variants committed,bf16,...] [--recipe YAML] [--padding-only] [--matmul]

1. padding: the share of real (non-padding) positions in random batches of the recipe's micro-batch size (the
   collator right-pads a batch to its longest sample), against length-sorted batches;
2. matrix products (`--matmul`): float32 against bfloat16 GFLOP/s for the shapes of a step (the frozen target
   head, the draft head, the draft MLP), 2 threads;
3. `--steps` steps of `--recipe` (default `recipes/eagle/eagle3_smollm2.yaml`) per variant, each in a child process, online on the
   target or from an offline cache (`--cache`, made by `draftsmith cache eagle` with the target's `final` state,
   which the soft-label variants need); mean step time over steps 2.. and the losses. Variants (`--variants`):
   committed (the recipe as committed: data labels, length-grouped batches, loss chunks of 2,048 tokens,
   float32), bf16 (the same, autocast to bfloat16: what the quickstart runs where bfloat16 is native), soft
   (the target's distribution as label), chunk256 (loss chunks of 256 tokens), ungrouped (random batches),
   before (soft labels, chunks of 256, random batches: the recipe before issue 27's step work), keep (committed,
   with the whole loss kept for backward: one chunk, no checkpoint), top1 / datalabels (`draft.labels=top1` /
   `data`: the scale recipe's labels against the quickstart's), len320 (`data.max_len=320`); `bf16+top1`
   combines two.
"""

from __future__ import annotations

import argparse
import json
import random
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "eagle" / "eagle3_smollm2.yaml"
VARIANTS: dict[str, list[str]] = {
    "committed": [],
    "bf16": ["train.mixed_precision=bf16"],
    "soft": ["draft.labels=target"],
    "chunk256": ["train.loss_chunk_tokens=256"],
    "ungrouped": ["train.group_by_length=false"],
    "before": ["draft.labels=target", "train.loss_chunk_tokens=256", "train.group_by_length=false"],
    "keep": [],
    "top1": ["draft.labels=top1"],  # the target's greedy token (a cache built with `top1`)
    "datalabels": ["draft.labels=data"],
    "len320": ["data.max_len=320"],
}


def padding(recipe: str, target: str, data: list[str], batch: int, sets: list[str]) -> tuple[float, float]:
    from transformers import AutoTokenizer

    from draftsmith.config.loader import load_config
    from draftsmith.train.core.data import build_datasets
    from draftsmith.train.eagle import RECIPE as EAGLE_RECIPE

    cfg = load_config(
        EAGLE_RECIPE, recipe, [f"target.path={target}", f"data.train=[{','.join(data)}]", *sets]
    )
    bundle = build_datasets(cfg.data, AutoTokenizer.from_pretrained(target), cfg.seed, progress=False)
    lens = [len(bundle.train[i]["input_ids"]) for i in range(len(bundle.train))]
    print(
        f"{len(lens)} samples, {sum(lens):,} tokens, {sum(lens) / len(lens):.0f} on average, at most {max(lens)}"
    )

    def share(order: list[int]) -> float:
        groups = [order[k : k + batch] for k in range(0, len(order) - batch + 1, batch)]
        real = sum(lens[i] for g in groups for i in g)
        return real / sum(batch * max(lens[i] for i in g) for g in groups)

    rng = random.Random(0)
    shuffled = []
    for _ in range(20):
        order = list(range(len(lens)))
        rng.shuffle(order)
        shuffled.append(share(order))
    return sum(shuffled) / len(shuffled), share(sorted(range(len(lens)), key=lens.__getitem__))


def matmul_rates() -> list[str]:
    """float32 and bfloat16 GFLOP/s of `linear(x [rows, k], w [n, k])` for a step's shapes, 2 threads."""
    import torch

    torch.set_num_threads(2)
    shapes = {
        "target head": (512, 576, 49152),
        "draft head": (512, 576, 8192),
        "draft MLP": (2560, 576, 1536),
    }
    lines = []
    for name, (rows, k, n) in shapes.items():
        rates = []
        for dtype in (torch.float32, torch.bfloat16):
            x, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
            for _ in range(2):
                torch.nn.functional.linear(x, w)
            start, reps = time.perf_counter(), 5
            for _ in range(reps):
                torch.nn.functional.linear(x, w)
            rates.append(2 * rows * k * n * reps / (time.perf_counter() - start) / 1e9)
        lines.append(
            f"{name} [{rows}, {k}] x [{k}, {n}]: float32 {rates[0]:.0f}, bfloat16 {rates[1]:.0f} GFLOP/s "
            f"({rates[1] / rates[0]:.1f}x)"
        )
    return lines


def run_steps(
    recipe: str,
    target: str,
    data: list[str],
    cache: str | None,
    steps: int,
    variant: str,
    out: Path,
    sets: list[str],
) -> None:
    """One training run of `steps` steps in this process (called in a child: see main)."""
    parts = variant.split("+")
    if "keep" in parts:
        import draftsmith.train.eagle as eagle
        from draftsmith.models.chunking import pack_positions

        def whole_loss(fn, inputs, chunk, keep=None):
            """The whole loss at once (on the trained positions, as chunked_loss), kept for backward."""
            return fn(*(inputs if keep is None else pack_positions(inputs, keep)))

        eagle.chunked_loss = whole_loss
    sys.argv = [
        "eagle", "--config", recipe, f"target.path={target}", f"data.train=[{','.join(data)}]",
        f"train.max_steps={steps}", "log.every=1", "eval.every=0", "data.eval_max_samples=1", f"output_dir={out}",
        *([f"data.cache={cache}"] if cache else []), *sets, *(o for part in parts for o in VARIANTS[part]),
    ]  # fmt: skip
    runpy.run_module("draftsmith.train.eagle", run_name="__main__", alter_sys=True)


def step_times(out: Path) -> tuple[list[float], list[float]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_s" in r]
    return [r["perf/step_s"] for r in rows], [r["train/loss"] for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the SmolLM2 directory (draftsmith build-target)")
    p.add_argument("--data", required=True, help="comma-separated answer files (the target's own answers)")
    p.add_argument("--cache", help="an offline feature cache of those answers (train from it, not online)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--recipe", default=str(RECIPE), help="the recipe the variants change (default: %(default)s)"
    )
    p.add_argument(
        "--variants",
        default="committed,keep",
        help=f"comma-separated, each one or more of {', '.join(VARIANTS)} joined by +",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for every variant (repeat), e.g. data.max_len=768 to match a cache",
    )
    p.add_argument("--padding-only", action="store_true")
    p.add_argument("--matmul", action="store_true", help="only the float32 / bfloat16 matrix-product rates")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    data = args.data.split(",")
    if args.child:
        run_steps(
            args.recipe, args.target, data, args.cache, args.steps, args.child, Path(args.out), args.set
        )
        return 0
    if args.matmul:
        print("\n".join(matmul_rates()))
        return 0
    variants = args.variants.split(",")
    unknown = sorted({part for v in variants for part in v.split("+")} - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; expected some of {', '.join(VARIANTS)}")
    real, grouped = padding(args.recipe, args.target, data, 8, args.set)
    print(f"real positions: random batches of 8 {real:.1%}, length-sorted {grouped:.1%}")
    if args.padding_only:
        return 0
    with tempfile.TemporaryDirectory(prefix="draftsmith-step-cost-") as tmp:
        for variant in variants:
            out = Path(tmp) / variant
            child = [
                sys.executable,
                "-m",
                "bench.eagle_step_cost",
                "--target",
                args.target,
                "--data",
                args.data,
            ]
            child += [
                "--recipe",
                args.recipe,
                "--steps",
                str(args.steps),
                "--child",
                variant,
                "--out",
                str(out),
            ]
            child += ["--cache", args.cache] if args.cache else []
            child += [f"--set={kv}" for kv in args.set]
            subprocess.run(child, cwd=REPO, check=True, capture_output=True)
            times, losses = step_times(out)
            later = times[1:]
            shown = ", ".join(f"{x:.3f}" for x in losses)
            print(
                f"{variant}: {sum(later) / len(later):.2f} s per step (steps 2-{len(times)}); losses {shown}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
