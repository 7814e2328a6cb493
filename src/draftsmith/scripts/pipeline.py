"""`draftsmith pipeline`: from a target and prompts to a measured, exported EAGLE-3 drafter, on the device present.

    draftsmith pipeline --target DIR|HUB_ID|FILE.gguf --data prompts.jsonl --heldout heldout.jsonl
    draftsmith pipeline --target DIR --data chats.jsonl --heldout mt_bench.jsonl --answers vllm --time-budget 60
    draftsmith pipeline --target DIR --data chats.jsonl --heldout h.jsonl --answers http://127.0.0.1:8000/v1
    draftsmith quickstart                              the same pipeline on SmolLM2-135M-Instruct, built in

Six stages, each with a progress bar, each resumable (run the same command again: it continues where it
stopped, or re-evaluates when everything is done):
  1. the target: a directory, a Hub id, a .gguf file or a preset, built once into the user cache;
  2. the answers: the target's own greedy answers to --data (the tokens the drafter will be asked to predict),
     generated here (transformers' `generate`; static KV cache and torch.compile on a GPU), by vLLM served for
     the stage (--answers vllm), or by a server already running (--answers URL); the long budget adds one
     sampled answer per prompt;
  3. the features: the target's hidden states at EAGLE-3's layers, stored once (--features cache), or
     computed at every training step instead (online: nothing on disk; auto picks online on a GPU);
  4. training EAGLE-3 (recipes/eagle/eagle3_smollm2.yaml; long budget: eagle3_smollm2_scale.yaml), on a GPU
     with a micro batch sized to its memory (train.micro_batch_size=N on the command line overrides it);
  5. evaluation: speculative decoding of --heldout, greedy, checked token for token against plain decoding,
     EAGLE-3 as a chain and a tree beside ngram (prompt lookup), and the depth to serve with (measured in vLLM
     where `draftsmith engine-setup vllm` has set it up);
  6. export: the drafter in the layout of each engine of --export (default vllm).

--time-budget MINUTES gives the answers and training deadlines (45 % and 85 % of it, counted from the start):
the answers stop with every finished batch kept, training with a checkpoint whose drafter goes on. The
features have none (training needs every kept answer's, and their time follows from the answers kept); the
evaluation's length is set by --eval-prompts. The closing table gives every stage's time,
tokens and tokens/s (also in OUTPUT_DIR/summary.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.runtime.deadline import Deadline
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import Interrupted
from draftsmith.runtime.files import write_json
from draftsmith.runtime.hardware import native_bfloat16
from draftsmith.scripts import pipeline_stages as stages
from draftsmith.scripts.pipeline_memory import train_micro_batch
from draftsmith.scripts.pipeline_plan import BUDGETS, CHAT_DATA, TOY_DATA, Budget, Plan
from draftsmith.scripts.pipeline_serving import SERVING_CHOICES
from draftsmith.scripts.pipeline_target import resolve_target
from draftsmith.ship.export import ENGINES

# Stages 2-6: a name, the function, and the fraction of --time-budget by which it must end (None: no deadline).
STAGES: tuple[tuple[str, Callable[[Plan], int], float | None], ...] = (
    ("answers", stages.answer_prompts, 0.45),
    ("features", stages.cache_features, None),  # training needs every answer's features; none is cut
    ("training", stages.train_eagle3, 0.85),
    ("evaluation", stages.evaluate_drafter, None),
    ("export", stages.export_drafter, None),
)
STOPPED = 130  # a command's exit status after Ctrl-C


@dataclass
class StageRecord:
    """What the closing table says of a stage."""

    name: str
    seconds: float
    tokens: int | None
    outcome: str  # done, stopped at its deadline, failed (exit N)
    exit_status: int = 0

    def row(self) -> tuple[str, ...]:
        rate = f"{self.tokens / self.seconds:,.0f}" if self.tokens and self.seconds > 0 else "-"
        tokens = "-" if self.tokens is None else f"{self.tokens:,}"
        return (self.name, f"{self.seconds:,.1f}", tokens, rate, self.outcome)


def build_parser(
    prog: str = "draftsmith pipeline", description: str | None = None
) -> argparse.ArgumentParser:
    """The command line: what goes in and where it comes from, then how much and how it runs."""
    p = argparse.ArgumentParser(
        prog=prog, description=description or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_source_arguments(p)
    add_run_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.lr=3e-3")
    p.set_defaults(preset_data=False)  # the quickstart's: without --data, the built-in chat prompts
    return p


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """The target, the prompts, and who writes the answers and the features."""
    p.add_argument("--target", help="a target directory, a Hub id, a .gguf file or a preset (built once)")
    p.add_argument(
        "--data", help="the prompts or chats the target answers (any format `data regenerate` reads)"
    )
    p.add_argument("--heldout", help="held-out prompts for the evaluation (default: --data's heldout split)")
    p.add_argument(
        "--answers",
        default="local",
        metavar="local|vllm|URL",
        help="who writes the target's answers: local (default; transformers here), vllm (served for the stage "
        "from `draftsmith engine-setup vllm`) or the URL of an OpenAI-compatible server already serving it",
    )
    p.add_argument(
        "--features",
        choices=["auto", "cache", "online"],
        default="auto",
        help="the target's features stored once (cache) or computed at every step (online); auto: online on a "
        "GPU, where the target's forward is cheap and a cache of millions of tokens is not, cache on a CPU",
    )


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How much the pipeline does, in what precision, and what it writes."""
    p.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="short",
        help="short (default): 480 prompts, greedy answers of 192 tokens, 3 epochs, 16 held-out prompts; "
        "long: 891 prompts answered greedily and once sampled, the scale recipe, 24 held-out prompts",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="how many of --data's prompts the target answers (default: the budget's)",
    )
    p.add_argument(
        "--answer-tokens", type=int, default=None, help="tokens per answer (default: the budget's)"
    )
    p.add_argument("--epochs", type=float, default=None, help="training epochs (default: the budget's)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default: the budget's)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="MIN",
        help="minutes for the answers, features and training",
    )
    p.add_argument(
        "--output-dir", type=Path, default=Path("runs/pipeline"), help="run directory (default runs/pipeline)"
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="precision of the answers, the features and training (autocast); auto: bfloat16 where this machine "
        "multiplies it natively (a GPU, or a CPU with AVX512-BF16 / AMX), else float32. The evaluation "
        "decodes with the target as built, checked token for token",
    )
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="the answers with a static KV cache and torch.compile (auto: on a GPU only; docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--export",
        default="vllm",
        help=f"engine layouts to write, comma-separated ({', '.join(ENGINES)}), or none (default vllm)",
    )
    p.add_argument(
        "--serving-depth",
        choices=SERVING_CHOICES,
        default="auto",
        help="whose costs choose the depth to serve: vllm (measured at depths 1..3; needs `draftsmith "
        "engine-setup vllm`), evaluator (draftsmith's own loop), auto (default: vllm where it is set up)",
    )


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    budget = resolve_budget(parser, args)
    start = time.perf_counter()
    if args.target is None:
        parser.error("--target is required: a target directory, a Hub id, a .gguf file or a preset")
    target, toy = resolve_target(args.target, progress=not args.no_progress)
    print(f"[1/6] target: {target} ({time.perf_counter() - start:.0f} s)")
    plan = make_plan(parser, args, budget, target, toy)
    print(
        f"      answers, features and training in {plan.dtype} (--dtype {args.dtype}), features {plan.features}"
    )
    records = run_stages(plan, args.time_budget, start)
    print("\n".join(table(["stage", "seconds", "tokens", "tokens/s", "outcome"], [r.row() for r in records])))
    total = time.perf_counter() - start
    summary = {
        "seconds": round(total, 1),
        "device": device_name(),
        "dtype": plan.dtype,
        "features": plan.features,
    }
    summary["stages"] = [dataclasses.asdict(r) for r in records]
    write_json(plan.out / "summary.json", summary)
    failed = next((r for r in records if r.exit_status != 0), None)
    if failed is not None:
        return failed.exit_status
    print(f"pipeline finished in {total:.0f} s; run directory: {plan.out} (summary.json)")
    return 0


def run_stages(plan: Plan, minutes: float | None, start: float) -> list[StageRecord]:
    """Stages 2-6 in order, each under its deadline; ends after a stage that failed."""
    records = []
    for name, stage, share in STAGES:
        record = run_stage(name, stage, plan, stage_deadline(name, minutes, share, start))
        records.append(record)
        if record.exit_status != 0:
            break
    return records


def stage_deadline(name: str, minutes: float | None, share: float | None, start: float) -> float | None:
    """Seconds left to stage `name`: until `share` of the budget of `minutes`, counted from `start` (None: no
    deadline, without a budget or for a stage that has none)."""
    if minutes is None or share is None:
        return None
    return minutes * 60 * share - (time.perf_counter() - start)


def run_stage(name: str, stage: Callable[[Plan], int], plan: Plan, seconds: float | None) -> StageRecord:
    """One stage under a deadline of `seconds`: stopped there the way Ctrl-C stops it, its work kept."""
    mark = stages.stage_mark(name, plan)
    began = time.perf_counter()
    deadline = Deadline(seconds)
    try:
        with deadline:
            code = stage(plan)
    except (KeyboardInterrupt, Interrupted):
        if not deadline.fired:
            raise
        code = STOPPED
    outcome = "done"
    if deadline.fired and code in (0, STOPPED):
        outcome = "stopped at its deadline"
        code = stages.finish_stopped_training(plan) if name == "training" and code == STOPPED else 0
    if code != 0:
        outcome = f"failed (exit {code})"
    return StageRecord(
        name, round(time.perf_counter() - began, 1), stages.stage_tokens(name, plan, mark), outcome
    )


def make_plan(
    parser: argparse.ArgumentParser, args: argparse.Namespace, budget: Budget, target: Path, toy: bool
) -> Plan:
    """The run's plan from the command line; what is missing or wrong exits with a usage error."""
    data = {"train": args.data, "heldout": args.heldout}
    preset = TOY_DATA if toy else CHAT_DATA
    if data["train"] is None:
        if not (toy or args.preset_data):
            parser.error("--data is required: the prompts or chats whose answers the drafter learns")
        data["train"] = preset["train"]
    if data["heldout"] is None:
        split = data["train"].removesuffix(":train")
        if split == data["train"]:
            parser.error("--heldout is required with your own --data: prompts the drafter never trained on")
        data["heldout"] = f"{split}:heldout"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    export = () if args.export == "none" else tuple(e.strip() for e in args.export.split(",") if e.strip())
    unknown = [e for e in export if e not in ENGINES]
    if unknown:
        parser.error(
            f"--export {args.export}: {unknown[0]!r} is not an engine; choose from {', '.join(ENGINES)}, or none"
        )
    features = args.features if args.features != "auto" else ("online" if device == "cuda" else "cache")
    plan = Plan(
        target=target,
        data=data,
        dtype=pipeline_dtype(args.dtype),
        budget=budget,
        out=args.output_dir,
        overrides=args.overrides,
        progress=not args.no_progress,
        serving=args.serving_depth,
        answers_from=answers_from(parser, args.answers),
        features=features,
        compile=args.compile,
        export=export,
    )
    micro_batch = train_micro_batch(
        target, plan.recipe, args.overrides, budget.prompts * (1 + budget.sampled)
    )
    return dataclasses.replace(plan, micro_batch=micro_batch)


def answers_from(parser: argparse.ArgumentParser, choice: str) -> str:
    if choice in ("local", "vllm") or choice.startswith(("http://", "https://")):
        return choice
    parser.error(f"--answers {choice}: choose local, vllm or a server's URL (http://HOST:PORT/v1)")
    raise AssertionError  # parser.error exits


def resolve_budget(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Budget:
    """The budget of --budget with the counts of the command line applied (bad counts exit with a usage error
    before any work)."""
    budget = BUDGETS[args.budget]
    given = {"prompts": args.prompts, "answer_tokens": args.answer_tokens, "epochs": args.epochs}
    given["eval_prompts"] = args.eval_prompts
    budget = dataclasses.replace(budget, **{k: v for k, v in given.items() if v is not None})
    counts_ok = min(budget.prompts, budget.answer_tokens, budget.eval_prompts) >= 1
    if not counts_ok or not (math.isfinite(budget.epochs) and budget.epochs > 0):
        parser.error(
            "--prompts, --answer-tokens and --eval-prompts must be >= 1 and --epochs a finite number > 0"
        )
    if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
        parser.error("--time-budget must be a number of minutes > 0")
    if args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"--output-dir {args.output_dir} is a file; choose a directory")
    return budget


def pipeline_dtype(choice: str) -> str:
    """The answers', features' and training's precision for `--dtype`: `auto` is bfloat16 where this machine
    multiplies it natively (a bfloat16 product ran 3.8-4.8x faster than float32 on the 2-core machine of
    docs/BENCHMARKS.md), float32 elsewhere (emulated bfloat16 is slower than float32)."""
    if choice != "auto":
        return choice
    return "bfloat16" if native_bfloat16("cuda" if torch.cuda.is_available() else "cpu") else "float32"


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
