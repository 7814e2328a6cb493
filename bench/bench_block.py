"""Block-parallel drafters and acceptance losses side by side (docs/BENCHMARKS.md, "DFlash, P-EAGLE and the
acceptance losses").

    python -m bench.bench_block train --target DIR --out DIR [--train-data X --eval-data Y] [--only a,b]
    python -m bench.bench_block eval  --target DIR --out DIR [--eval-data Y] [--only a,b]
    python -m bench.bench_block table --out DIR
    python -m bench.bench_block speed --target DIR --out DIR    (run alone: tokens/s of the T=0 chain cells)

Every drafter is trained by its toy recipe on the same conversations for one epoch (equal training tokens:
the recipes share `data.max_samples`, `data.max_len` and the micro-batch), then measured by the same
evaluator on the same held-out prompts at T=0 and T=1, as a chain of depth 5 (Medusa and MTP: as deep as their
heads / modules reach, when fewer) and as its tree (the EAGLE-2
dynamic tree `dynamic:4:16` for EAGLE-1 / EAGLE-3, `topk:3` for the others; P-EAGLE drafts chains only). The
T=0 chain cell also checks that the output equals plain greedy decoding.
DFlash is also measured at depth 7, the whole block its one pass drafts. Reported per cell: tau, its standard
error, alpha, acceptance by depth and decoding tokens/s; per drafter: the mean training step time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from pathlib import Path
from typing import Any

from draftsmith.recipes import __file__ as recipes_init
from draftsmith.runtime.display import table as md_table

RECIPES = Path(recipes_init).parent
# name -> (training method, recipe, overrides); ngram trains nothing.
LINEUP: dict[str, tuple[str, str, list[str]]] = {
    "dflash": ("dflash", "dflash/toy.yaml", []),
    "dflash-kl": ("dflash", "dflash/toy.yaml", ["objective.loss=kl"]),
    "peagle": ("peagle", "peagle/toy.yaml", []),
    "peagle-dpace": ("peagle", "peagle/toy.yaml", ["objective.weighting=dpace"]),
    "eagle3": ("eagle", "eagle/eagle3_toy.yaml", []),
    "eagle3-lk_alpha": ("eagle", "eagle/eagle3_toy.yaml", ["objective.loss=lk_alpha"]),
    "eagle3-lk_lambda": ("eagle", "eagle/eagle3_toy.yaml", ["objective.loss=lk_lambda"]),
    "eagle1": ("eagle", "eagle/eagle1_toy.yaml", []),
    "medusa": ("medusa", "medusa/toy.yaml", []),
    "mtp": ("mtp", "mtp/toy.yaml", ["train.allow_unserved=true"]),
}
TREES = {
    "eagle3": "dynamic:4:16",
    "eagle1": "dynamic:4:16",
    "peagle": None,
    "peagle-dpace": None,
}  # default topk:3
EXTRA_DEPTH = {"dflash": 7}


def _names(only: str | None) -> list[str]:
    names = ["ngram", *LINEUP]
    return [n for n in names if only is None or n in only.split(",")]


def train(args: argparse.Namespace) -> None:
    for name in _names(args.only):
        if name == "ngram" or (args.out / name / "final" / "config.json").is_file():
            continue
        method, recipe, overrides = LINEUP[name]
        data = [f"data.train=[{args.train_data}]", f"data.eval=[{args.eval_data}]"] if args.train_data else []
        argv = [
            "--config",
            str(RECIPES / recipe),
            f"target.path={args.target}",
            f"output_dir={args.out / name}",
            *overrides,
            *data,
        ]
        code = importlib.import_module(f"draftsmith.train.{method}").main(argv)
        if code:
            raise SystemExit(f"training {name} exited {code}")


def _tree(name: str) -> str | None:
    return TREES.get(name.split("-")[0] if name.startswith("eagle3") else name, "topk:3")


def _depth(spec: str) -> int:
    """5, or fewer for a drafter that drafts fewer tokens ahead (Medusa's heads, MTP's modules)."""
    if spec == "ngram":
        return 5
    from draftsmith.models.checkpoint import read_drafter_config

    drafter = read_drafter_config(spec)["drafter"]
    return min(5, drafter.get("num_heads") or drafter.get("num_modules") or 5)


def evaluate_all(args: argparse.Namespace) -> None:
    from draftsmith.eval.acceptance import EvalArgs, evaluate

    results = args.out / "results.jsonl"
    done = {(r["name"], r["tree"], r["depth"], r["temperature"]) for r in _read(results)}
    for name in _names(args.only):
        spec = "ngram" if name == "ngram" else str(args.out / name / "final")
        d = _depth(spec)
        cells = [
            ("chain", d),
            *([(t, d)] if (t := _tree(name)) else []),
            *([("chain", EXTRA_DEPTH[name])] if name in EXTRA_DEPTH else []),
        ]
        for tree, depth in cells:
            for temperature in (0.0, 1.0):
                if (name, tree, depth, temperature) in done:
                    continue
                # The T=0 chain cell also decodes plainly: the lossless check (and the plain tokens/s).
                check = temperature == 0.0 and tree == "chain" and depth == d
                r = evaluate(
                    EvalArgs(
                        target=args.target,
                        drafter=spec,
                        data=args.eval_data,
                        num_prompts=args.num_prompts,
                        max_new_tokens=args.max_new_tokens,
                        depth=depth,
                        tree=tree,
                        temperature=temperature,
                        baseline=check,
                        check_lossless=check,
                        progress=False,
                    )
                )
                row = {
                    "name": name,
                    "tree": tree,
                    "depth": depth,
                    "temperature": temperature,
                    **{
                        k: r[k]
                        for k in (
                            "tau",
                            "tau_stderr",
                            "alpha",
                            "acceptance_by_depth",
                            "tokens_per_s",
                            "lossless",
                            "target_forwards",
                            "new_tokens",
                        )
                    },
                }
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row))


def speed(args: argparse.Namespace) -> None:
    """Decoding tokens/s of each drafter's T=0 depth-5 chain beside plain decoding, one drafter at a time (run it
    on an otherwise idle machine; the eval cells' tokens/s depend on whatever else ran)."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate

    for name in _names(args.only):
        spec = "ngram" if name == "ngram" else str(args.out / name / "final")
        if spec != "ngram" and not Path(spec).is_dir():
            continue
        r = evaluate(
            EvalArgs(
                target=args.target,
                drafter=spec,
                data=args.eval_data,
                num_prompts=args.num_prompts,
                max_new_tokens=args.max_new_tokens,
                depth=_depth(spec),
                tree="chain",
                temperature=0.0,
                baseline=True,
                check_lossless=False,
                progress=False,
            )
        )
        keys = ("tau", "tokens_per_s", "baseline_tokens_per_s", "speedup", "draft_time_s", "verify_time_s")
        print(json.dumps({"name": name, **{k: r[k] for k in keys}}), flush=True)


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def step_time(run: Path) -> float | None:
    """Mean `perf/step_s` over the run's logged training records (None when absent)."""
    times = [r["perf/step_s"] for r in _read(run / "metrics.jsonl") if "perf/step_s" in r]
    return statistics.mean(times) if times else None


def table(args: argparse.Namespace) -> str:
    rows = _read(args.out / "results.jsonl")
    by = {(r["name"], r["tree"] == "chain", r["depth"], r["temperature"]): r for r in rows}
    header = [
        "drafter",
        "T=0 chain",
        "T=0 tree",
        "T=1 chain",
        "T=1 tree",
        "alpha T=0 chain",
        "tok/s T=0 chain",
    ]
    lines = []
    names = list(dict.fromkeys(r["name"] for r in rows))
    for name in names:
        for depth in sorted({r["depth"] for r in rows if r["name"] == name}):
            cells = []
            for temperature in (0.0, 1.0):
                for chain in (True, False):
                    r = by.get((name, chain, depth, temperature))
                    cells.append(
                        "-"
                        if r is None
                        else f"{r['tau']:.3f} ± {r['tau_stderr']:.3f}"
                        + ("" if r["lossless"] in (True, None) else " NOT LOSSLESS")
                    )
            c0 = by.get((name, True, depth, 0.0))
            st = step_time(args.out / name) if name != "ngram" else None
            label = f"{name} (depth {depth})" if depth != 5 else name
            decode = [f"{c0['alpha']:.3f}", f"{c0['tokens_per_s']:.1f}"] if c0 else ["-", "-"]
            lines.append([label, *cells, *decode, f"{st:.2f} s" if st else "-"])
    depth_rows = []
    for name in names:
        r = by.get((name, True, min(x["depth"] for x in rows if x["name"] == name), 0.0))
        if r:
            accept = [*r["acceptance_by_depth"], *[None] * (5 - len(r["acceptance_by_depth"]))]
            depth_rows.append([name, *(f"{a:.2f}" if a is not None else "-" for a in accept[:5])])
    return "\n".join(
        [
            *md_table([*header, "training step"], lines),
            "",
            "Acceptance by depth (T=0 chain, depth 5 or the drafter's deepest):",
            "",
            *md_table(["drafter", "1", "2", "3", "4", "5"], depth_rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["train", "eval", "table", "speed"])
    parser.add_argument("--target", help="the toy target directory")
    parser.add_argument("--out", type=Path, required=True, help="runs and results.jsonl go here")
    parser.add_argument("--train-data", help="training data (default: the recipes' stdlib:train)")
    parser.add_argument(
        "--eval-data", default="stdlib:heldout", help="held-out prompts (and the runs' eval data)"
    )
    parser.add_argument("--only", help="comma-separated drafter names (default: all)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "train":
        train(args)
    elif args.what == "eval":
        evaluate_all(args)
    elif args.what == "speed":
        speed(args)
    else:
        print(table(args))


if __name__ == "__main__":
    main()
