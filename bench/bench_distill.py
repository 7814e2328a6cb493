"""Distillation matrix: divergence x data generator -> tau of the distilled draft LM (docs/BENCHMARKS.md).

    python -m bench.bench_distill --target DIR --out DIR [--max-samples 1200] [--num-prompts 20]

Every run trains the same draft (the target's first layer, embeddings, norm and head copied: recipes/
distill/toy.yaml) on the same number of optimizer steps and batch size; only `distill.divergence` and the
data generator change:
  fixed        the recipe's conversations (stdlib:train)
  regenerated  the same prompts answered by the target (`draftsmith data regenerate`, T=1: sequence-level KD)
  on-policy    fixed data with GKD lambda = 0.5 (half the batches are the draft's own samples, T=1)
CE trains on data tokens, so it has no on-policy cell. Each draft is measured by real speculative decoding
(chain of depth 5) on held-out prompts at T=0 and T=1; the copied draft before training is the first row.
Results go to OUT/distill.json, one JSON line per cell as it finishes (a rerun skips finished cells).

Feeds docs/BENCHMARKS.md, "Draft-LM distillation on the `small` toy target".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from draftsmith.runtime.display import table as md_table

DIVERGENCES = ("ce", "fkl", "rkl", "jsd", "tvd")
DATA = ("fixed", "regenerated", "on-policy")


def trained_tokens(metrics_file: Path) -> int:
    """Answer positions the loss saw over the run (the sum of the logged training windows)."""
    from draftsmith.train.core.metrics import read_metrics

    return int(sum(r.get("train/tokens", 0) for r in read_metrics(metrics_file)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="toy target directory (small preset)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-samples", type=int, default=1200, help="training conversations (one epoch)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--depth", type=int, default=5)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.draft_lm import DraftLMConfig, build_draft_lm, save_draft_lm
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.scripts.data import regenerate
    from draftsmith.train import distill

    repo = Path(__file__).resolve().parents[1]
    target = FrozenTarget.load(TargetConfig(path=args.target))
    results_path = args.out / "distill.json"
    done = {}
    if results_path.is_file():
        for line in results_path.read_text().splitlines():
            row = json.loads(line)
            done[(row["divergence"], row["data"])] = row

    regen = args.out / "regenerated.jsonl"
    regenerate.main(
        [
            "--target",
            args.target,
            "--data",
            "stdlib:train",
            "--max-samples",
            str(args.max_samples),
            "--out",
            str(regen),
            "--temperature",
            "1.0",
            "--top-p",
            "1.0",
            "--max-new-tokens",
            "320",
            "--batch-size",
            "32",
        ]
    )

    def measure(name: str, data: str, ckpt: Path, train_s: float) -> None:
        drafter = load_drafter_spec(str(ckpt), target)
        row: dict = {"divergence": name, "data": data, "train_s": train_s}
        for temperature in (0.0, 1.0):
            r = evaluate(
                EvalArgs(
                    target=args.target,
                    drafter=str(ckpt),
                    data="stdlib:heldout",
                    num_prompts=args.num_prompts,
                    max_new_tokens=args.max_new_tokens,
                    depth=args.depth,
                    temperature=temperature,
                    baseline=temperature == 0,
                    check_lossless=temperature == 0,
                    progress=False,
                ),
                target,
                drafter,
            )
            row[f"tau_T{temperature:g}"] = r["tau"]
            if temperature == 0:
                row["lossless"] = r["lossless"]
        metrics = ckpt / "draftsmith.json"
        if metrics.is_file():
            heldout = json.loads(metrics.read_text()).get("training", {}).get("heldout", {})
            row["heldout_accept"] = heldout.get(f"eval/{name}/accept")
            row["trained_tokens"] = trained_tokens(ckpt.parent / "metrics.jsonl")
        print(json.dumps(row), flush=True)
        with results_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    if ("none", "copied") not in done:
        init = save_draft_lm(
            args.out / "copied", build_draft_lm(DraftLMConfig(init="target"), target), target
        )
        measure("none", "copied", init, 0.0)
    for data in DATA:
        for name in DIVERGENCES:
            if (name, data) in done or (name == "ce" and data == "on-policy"):
                continue
            run_dir = args.out / f"{name}-{data}"
            overrides = [
                "--config",
                str(repo / "recipes" / "distill" / "toy.yaml"),
                f"target.path={args.target}",
                f"output_dir={run_dir}",
                f"data.max_samples={args.max_samples}",
                f"distill.divergence={name}",
                "checkpoint.every=0",
            ]
            if data == "regenerated":
                overrides.append(f"data.train=[{regen}]")
            if data == "on-policy":
                overrides.append("distill.on_policy=0.5")
            t0 = time.perf_counter()
            distill.main(overrides)
            measure(name, data, run_dir / "final", time.perf_counter() - t0)
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    print(format_table(rows))
    return 0


def format_table(rows: list[dict]) -> str:
    """Markdown: one row per divergence, T=0 / T=1 tau for each data generator."""
    cell = {(r["divergence"], r["data"]): r for r in rows}
    header = ["divergence", *(f"{d} T={t}" for d in DATA for t in (0, 1))]
    lines = []
    for name in ("none", *DIVERGENCES):
        data = ("copied",) if name == "none" else DATA
        if not any((name, d) in cell for d in data):
            continue
        values = []
        for d in DATA:
            r = cell.get(("none", "copied") if name == "none" and d == "fixed" else (name, d))
            values += (
                [f"{r['tau_T0']:.3f}", f"{r['tau_T1']:.3f}"]
                if r
                else ["", ""]
                if name == "none"
                else ["n/a", "n/a"]
            )
        label = "untrained (copied layer)" if name == "none" else name
        lines.append([label, *values])
    return "\n".join(md_table(header, lines))


if __name__ == "__main__":
    sys.exit(main())
