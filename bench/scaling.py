r"""The scaling benchmark (docs/BENCHMARKS.md, "Scaling"): EAGLE-3 on SmolLM2-135M-Instruct trained on growing
prefixes of one shuffled data mix, each measured by real speculative decoding on MT-bench, GSM8K and HumanEval
next to ngram, and the fitted curve's prediction of the largest point from the smaller ones.

    python -m bench.scaling --target DIR --mix mix.jsonl --cache CACHE --out OUT \
        [--sizes 64k,256k,1m,2m] [--min-seen 256k] [--max-epochs 4] [--eval-prompts 16] [--eval-tokens 96] \
        [--goal-tau 2.0] [--table-only] \
        [--sets mt_bench,gsm8k,humaneval] [--set KEY=VALUE ...] [--drafter NAME=CKPT@TOKENS ...]

The mix and its cache come first (docs/BENCHMARKS.md, "Training data at scale"):

    draftsmith data mix ../shared/data/... --exclude EVAL_SETS ... --target DIR --out mix.jsonl
    draftsmith cache eagle --config recipes/eagle/eagle3_smollm2_scale.yaml target.path=DIR \
        'data.train=[mix.jsonl]' data.cache=CACHE

Sizes are training tokens (samples' tokens, prompt included): each point trains on the cache's first samples
up to that many tokens (`data.max_samples`), so the points are nested samples of the same mix and share one
held-out split. One rule for every size: `train.epochs = min(4, max(1, 256k / tokens))` (every drafter sees
at least one epoch and at least 256k tokens; `--min-seen` and `--max-epochs` change the 256k and the 4),
recipes/eagle/eagle3_smollm2_scale.yaml otherwise, bfloat16
autocast where the CPU has it. Each drafter is evaluated at T = 0 as a chain of depth 5 (plain decoding once
per set, every answer checked against it), with the evaluator's recommended depth and its expected speedup.
Resumable: a trained size and a written report are kept.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench.real_target import EVAL_SETS, SHARED, cli, eval_items, run

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "eagle" / "eagle3_smollm2_scale.yaml"
MIN_SEEN = "256k"  # the rule's defaults: at least one epoch and at least this many tokens seen,
MAX_EPOCHS = 4.0  # and at most this many epochs (--min-seen, --max-epochs)


def parse_size(text: str) -> int | None:
    """'64k' -> 65,536 tokens, '2m' -> 2,097,152; 'all' -> None (the whole cache)."""
    text = text.strip().lower()
    if text == "all":
        return None
    scale = {"k": 1 << 10, "m": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * scale)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", type=Path, required=True, help="the SmolLM2 directory")
    p.add_argument("--mix", type=Path, required=True, help="the data mix the cache was built from")
    p.add_argument("--cache", type=Path, required=True, help="its feature cache (eagle3_smollm2_scale.yaml)")
    p.add_argument("--out", type=Path, default=Path("runs/scaling"))
    p.add_argument("--sizes", default="64k,256k,1m,2m", help="training tokens per point (k, m, or 'all')")
    p.add_argument(
        "--eval-prompts", type=int, default=16, help="items per set (MT-bench: half, two turns each)"
    )
    p.add_argument("--eval-tokens", type=int, default=96, help="new tokens per answer")
    p.add_argument(
        "--min-seen",
        default=MIN_SEEN,
        help="each point trains at least one epoch and at least this many tokens in all (k, m)",
    )
    p.add_argument("--max-epochs", type=float, default=MAX_EPOCHS, help="and at most this many epochs")
    p.add_argument("--goal-tau", type=float, default=2.0, help="the tau whose data need is estimated")
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="NAME=CKPT[@TOKENS]",
        help="another drafter to evaluate on the same sets and list in the table (e.g. one trained on other "
        "data, TOKENS its training tokens); repeatable",
    )
    p.add_argument(
        "--sets",
        default=",".join(EVAL_SETS),
        help=f"the sets to evaluate on (default all: {','.join(EVAL_SETS)}); the table shows what was measured",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for every size's training (e.g. data.max_len=768 for long answers); repeatable",
    )
    p.add_argument("--table-only", action="store_true", help="print the table from the reports written")
    return p


def prefix_sizes(cache: Path, sizes: list[int | None]) -> list[tuple[int, int]]:
    """(samples, tokens) of the cache's shortest train prefix holding each size's tokens."""
    from draftsmith.train.cache.store import FeatureCache
    from draftsmith.train.core.data import sample_lengths

    lengths = sample_lengths(FeatureCache.open(cache, verify=False).dataset("train").tokens_only())
    out = []
    for size in sizes:
        total, n = 0, 0
        for n, length in enumerate(lengths, start=1):  # noqa: B007 (n is the prefix length)
            total += length
            if size is not None and total >= size:
                break
        out.append((n, total))
    return out


def extra_drafters(args: argparse.Namespace) -> dict[str, tuple[str, int | None]]:
    """--drafter NAME=CKPT[@TOKENS] as {name: (checkpoint, tokens)}."""
    out: dict[str, tuple[str, int | None]] = {}
    for text in args.drafter:
        name, _, rest = text.partition("=")
        ckpt, _, tokens = rest.partition("@")
        if not name or not ckpt:
            raise SystemExit(f"--drafter {text!r}: expected NAME=CKPT[@TOKENS]")
        out[name] = (ckpt, int(tokens) if tokens else None)
    return out


def epochs_for(args: argparse.Namespace, tokens: int) -> float:
    min_seen = parse_size(args.min_seen)
    if min_seen is None:
        raise SystemExit(f"--min-seen {args.min_seen!r}: expected a token count such as 256k or 1m")
    return min(args.max_epochs, max(1.0, min_seen / tokens))


def train(args: argparse.Namespace, samples: int, tokens: int) -> Path:
    from draftsmith.runtime.hardware import native_bfloat16

    run_dir = args.out / "train" / f"tokens-{tokens}"
    final = run_dir / "final"
    if final.is_dir():
        return final
    epochs = epochs_for(args, tokens)
    print(f"[train] {tokens:,} tokens ({samples:,} samples), {epochs:g} epochs", flush=True)
    bf16 = native_bfloat16()
    t0 = time.perf_counter()
    cmd = cli(
        *("train", "eagle", "--config", str(RECIPE), f"target.path={args.target}"),
        *(f"data.train=[{args.mix}]", f"data.cache={args.cache}", "data.cache_verify=false"),
        *(f"data.max_samples={samples}", f"train.epochs={epochs}", f"output_dir={run_dir}"),
        *(("target.dtype=bfloat16", "train.mixed_precision=bf16") if bf16 else ()),
        *args.overrides,
        "--resume",
    )
    run(cmd, args.out / "logs" / f"train-{tokens}.log")
    (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return final


def evaluate(args: argparse.Namespace, drafters: dict[str, str]) -> None:
    """Every drafter on every set, a chain at T = 0 of depth 5 (the evaluator's default; a drafter that drafts
    fewer, such as MTP's modules, as deep as it drafts); plain decoding once per set."""
    from draftsmith.eval.acceptance import EvalArgs
    from draftsmith.eval.acceptance import evaluate as run_eval
    from draftsmith.eval.depth import recalibrated
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.report import TurnResult
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.runtime.files import write_json

    model = FrozenTarget.load(TargetConfig(path=str(args.target), dtype="float32"))
    for dataset, rel in EVAL_SETS.items():
        if dataset not in args.sets.split(","):
            continue
        base_path = args.out / "eval" / f"{dataset}-plain.json"
        for name, drafter in drafters.items():
            path = args.out / "eval" / f"{dataset}-{name}.json"
            if path.is_file():
                continue
            first = not base_path.is_file()
            print(f"[eval] {name} on {dataset}", flush=True)
            turns: list[TurnResult] = []
            report = run_eval(
                EvalArgs(
                    target=str(args.target),
                    drafter=drafter,
                    data=str(SHARED / rel),
                    num_prompts=eval_items(dataset, args.eval_prompts),
                    max_new_tokens=args.eval_tokens,
                    depth=None,
                    tree="chain",
                    baseline=first,
                    check_lossless=first,
                    dtype="float32",
                    progress=False,
                ),
                model,
                load_drafter_spec(drafter, model),
                record=turns,
            )
            if first:
                plain = [turn.baseline.tokens if turn.baseline else None for turn in turns]
                write_json(base_path, {"tokens_per_s": report["baseline_tokens_per_s"], "answers": plain})
            base = json.loads(base_path.read_text())
            report["speedup"] = report["tokens_per_s"] / base["tokens_per_s"]
            report["lossless"] = [turn.spec.tokens for turn in turns] == base["answers"]
            depth = report["settings"]["depth"]
            report.update(recalibrated(report, depth, base["tokens_per_s"]))  # against the set's plain rate
            write_json(path, report)


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def table(args: argparse.Namespace, points: list[tuple[int, int]]) -> str:
    """tau per set and size next to ngram, the fit's prediction of the largest point, the data for --goal-tau."""
    from draftsmith.eval.scaling import Point, extrapolation, fit, predict, tokens_for
    from draftsmith.runtime.display import table as md_table

    extras = extra_drafters(args)
    names = [f"tokens-{t}" for _, t in points] + list(extras) + ["ngram"]
    sizes = [t for _, t in points] + [extras[n][1] for n in extras] + [0]
    header = ["drafter", "training tokens", "epochs", "train wall"]
    header += [f"{d} {what}" for d in EVAL_SETS for what in ("tau (depth 5)", "recommended depth")]
    rows = []
    for name, tokens in zip(names, sizes, strict=True):
        cells, lossless = [], []
        for dataset in EVAL_SETS:
            r = _read(args.out / "eval" / f"{dataset}-{name}.json")
            if r is None:
                cells += ["-", "-"]
                continue
            evaluated = r.get("settings", {}).get("depth", 5)
            cells.append(
                f"{r['tau']:.3f} ± {r['tau_stderr'] or 0:.3f}"
                + ("" if evaluated == 5 else f" (depth {evaluated})")
            )
            depth, speedup = r.get("recommended_depth"), r.get("recommended_speedup")
            cells.append("-" if depth is None else f"{depth} ({speedup:.2f}x)" if depth else "off")
            lossless.append(bool(r.get("lossless")))
        wall = args.out / "train" / name / "wall_s.txt"
        if name in extras:  # beside the checkpoint or in its run directory
            ckpt = Path(extras[name][0])
            wall = ckpt / "wall_s.txt" if (ckpt / "wall_s.txt").is_file() else ckpt.parent / "wall_s.txt"
        meta = [
            "-" if tokens is None else f"{tokens:,}",
            f"{epochs_for(args, tokens):g}" if name.startswith("tokens-") and tokens else "-",
            f"{float(wall.read_text()):.0f} s" if wall.is_file() else "-",
        ]
        if name == "ngram":
            meta = ["-", "-", "-"]
        ok = "yes" if lossless and all(lossless) else ("NO" if lossless else "-")
        rows.append([name, *meta, *cells, ok])
    lines = [*md_table([*header, "lossless"], rows), ""]
    for dataset in EVAL_SETS:
        measured = []
        for _, tokens in points:
            r = _read(args.out / "eval" / f"{dataset}-tokens-{tokens}.json")
            if r is not None:
                measured.append(Point(tokens, r["tau"], r["tau_stderr"] or 0.0))
        if len(measured) < 3:
            continue
        small, largest = measured[:-1], measured[-1]
        guess = predict(small, largest.tokens)
        assert (
            guess.value is not None and guess.low is not None and guess.high is not None
        )  # a line always predicts
        line = fit(measured)
        need = tokens_for(measured, args.goal_tau)
        need_text = (
            "never (the fitted line does not rise)"
            if need.value is None
            else f"{need.value / 1e6:,.1f}M tokens (80% range {_m(need.low)}-{_m(need.high)}; "
            f"{extrapolation(measured, need.value):.0f}x the largest measured)"
        )
        lines.append(
            f"- {dataset}: tau = {line.a:.3f} + {line.b:.4f} ln(tokens). Predicted from the {len(small)} smaller "
            f"points at {largest.tokens:,} tokens: {guess.value:.3f} (80% range {guess.low:.3f}-{guess.high:.3f}), "
            f"measured {largest.tau:.3f} ± {largest.stderr:.3f} (error {guess.value - largest.tau:+.3f}). "
            f"tau {args.goal_tau:g} needs {need_text}."
        )
    return "\n".join(lines)


def _m(tokens: float | None) -> str:
    if tokens is None or math.isinf(tokens):
        return "never"
    return f"{tokens / 1e6:,.1f}M"


def plot(args: argparse.Namespace, points: list[tuple[int, int]]) -> Path | None:
    from draftsmith.runtime.display import pyplot

    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for dataset in EVAL_SETS:
        if dataset not in args.sets.split(","):
            continue
        xs, ys, es = [], [], []
        for _, tokens in points:
            r = _read(args.out / "eval" / f"{dataset}-tokens-{tokens}.json")
            if r is not None:
                xs.append(tokens)
                ys.append(r["tau"])
                es.append(r["tau_stderr"] or 0.0)
        line = ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"EAGLE-3, {dataset}")
        for name, (_, size) in extra_drafters(args).items():
            r = _read(args.out / "eval" / f"{dataset}-{name}.json")
            if r is not None and size:
                ax.errorbar(
                    [size],
                    [r["tau"]],
                    yerr=[r["tau_stderr"] or 0.0],
                    marker="s",
                    capsize=3,
                    color=line[0].get_color(),
                    label=f"{name}, {dataset}",
                )
        ngram = _read(args.out / "eval" / f"{dataset}-ngram.json")
        if ngram is not None:
            ax.axhline(ngram["tau"], linestyle="--", color=line[0].get_color(), alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("tau (chain, depth 5, T = 0)")
    ax.set_title("SmolLM2-135M-Instruct: tau against data (dashed: ngram)")
    ax.legend(fontsize=8)
    path = args.out / "scaling.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if unknown := set(args.sets.split(",")) - set(EVAL_SETS):
        parser.error(f"--sets: no set {', '.join(sorted(unknown))}; the sets are {', '.join(EVAL_SETS)}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    points = prefix_sizes(args.cache, sizes)
    if not args.table_only:
        t0 = time.perf_counter()
        drafters = {f"tokens-{tokens}": str(train(args, n, tokens)) for n, tokens in points}
        extras = {name: ckpt for name, (ckpt, _) in extra_drafters(args).items()}
        evaluate(args, {**drafters, **extras, "ngram": "ngram"})
        print(f"finished in {time.perf_counter() - t0:.0f} s", flush=True)
    text = table(args, points)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    png = plot(args, points)
    if png is not None:
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
