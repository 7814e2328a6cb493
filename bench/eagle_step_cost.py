r"""Where an online EAGLE-3 training step's time goes on SmolLM2 (docs/BENCHMARKS.md, "A real target"):

    python -m bench.eagle_step_cost --target DIR --data a.jsonl,b.jsonl [--steps 6] [--padding-only]

1. padding: the share of real (non-padding) positions in random batches of the recipe's micro-batch size (the
   collator right-pads a batch to its longest sample), against length-sorted batches;
2. the chunked loss's recomputation: `--steps` steps of `recipes/eagle/eagle3_smollm2.yaml` as committed (each
   loss chunk recomputed in backward), then the same steps with the whole loss kept for backward (one chunk, no
   checkpoint: `chunked_loss` replaced for this process only); mean step time over steps 2.. and the losses,
   which must be equal.
"""

from __future__ import annotations

import argparse
import json
import random
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "eagle" / "eagle3_smollm2.yaml"


def padding(target: str, data: list[str], batch: int) -> tuple[float, float]:
    from transformers import AutoTokenizer

    from draftsmith.config.loader import load_config
    from draftsmith.train.core.data import build_datasets
    from draftsmith.train.eagle import RECIPE as EAGLE_RECIPE

    cfg = load_config(EAGLE_RECIPE, RECIPE, [f"target.path={target}", f"data.train=[{','.join(data)}]"])
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


def run_steps(target: str, data: list[str], steps: int, keep: bool, out: Path) -> None:
    """One training run of `steps` steps in this process (called in a child: see main)."""
    if keep:
        import draftsmith.train.eagle as eagle

        # the whole loss at once, kept for backward
        eagle.chunked_loss = lambda fn, inputs, chunk: fn(*inputs)
    sys.argv = [
        "eagle", "--config", str(RECIPE), f"target.path={target}", f"data.train=[{','.join(data)}]",
        f"train.max_steps={steps}", "log.every=1", "eval.every=0", "data.eval_max_samples=1", f"output_dir={out}",
    ]  # fmt: skip
    runpy.run_module("draftsmith.train.eagle", run_name="__main__", alter_sys=True)


def step_times(out: Path) -> tuple[list[float], list[float]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_s" in r]
    return [r["perf/step_s"] for r in rows], [r["train/loss"] for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the SmolLM2 directory (draftsmith build-target)")
    p.add_argument(
        "--data", required=True, help="comma-separated answer files (bench/real_target.py's data/)"
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--padding-only", action="store_true")
    p.add_argument("--child", choices=["recompute", "keep"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    data = args.data.split(",")
    if args.child:
        run_steps(args.target, data, args.steps, args.child == "keep", Path(args.out))
        return 0
    real, grouped = padding(args.target, data, 8)
    print(f"real positions: random batches of 8 {real:.1%}, length-sorted {grouped:.1%}")
    if args.padding_only:
        return 0
    with tempfile.TemporaryDirectory(prefix="draftsmith-step-cost-") as tmp:
        results = {}
        for mode in ("recompute", "keep"):
            out = Path(tmp) / mode
            subprocess.run(
                [sys.executable, "-m", "bench.eagle_step_cost", "--target", args.target, "--data", args.data,
                 "--steps", str(args.steps), "--child", mode, "--out", str(out)],
                cwd=REPO, check=True, capture_output=True,
            )  # fmt: skip
            results[mode] = step_times(out)
    for mode, (times, losses) in results.items():
        later = times[1:]
        print(f"{mode}: {sum(later) / len(later):.2f} s per step (steps 2-{len(times)}); losses {losses}")
    same = results["recompute"][1] == results["keep"][1]
    print("losses equal" if same else "LOSSES DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
