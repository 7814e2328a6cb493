"""The quickstart: build the `small` toy target if absent, train Medusa heads on it, then measure them by real
speculative decoding on held-out prompts next to the `ngram` (prompt lookup) baseline.

Runs on CPU with no network in under 10 minutes on 2 cores. Re-running it resumes (or, when finished,
re-evaluates) the same run instead of starting over.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith quickstart", description=__doc__)
    parser.add_argument("--preset", choices=["tiny", "small"], default="small", help="toy target size")
    parser.add_argument("--target", type=Path, default=None, help="target dir (default: ~/.cache/draftsmith)")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("runs/quickstart-medusa"), help="run directory"
    )
    parser.add_argument(
        "--eval-prompts", type=int, default=20, help="held-out prompts for the final evaluation"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.lr=3e-3"
    )
    args = parser.parse_args(argv)

    from draftsmith.toy.build import default_target_dir
    from draftsmith.toy.target import build_toy_target
    from draftsmith.train import medusa

    t0 = time.perf_counter()
    target = args.target or default_target_dir(args.preset, 0)
    if (target / "build.json").is_file():
        print(f"[1/3] toy target: {target} (already built)")
    else:
        print(f"[1/3] building the {args.preset!r} toy target in {target} (one-off)")
        build_toy_target(args.preset, target, seed=0, force=True)
    recipe = files("draftsmith.recipes").joinpath(
        "medusa", "toy.yaml" if args.preset == "small" else "tiny.yaml"
    )
    print(f"[2/3] training Medusa heads: {recipe}")
    code = medusa.main(
        ["--config", str(recipe), f"target.path={target}", f"output_dir={args.output_dir}", *args.overrides]
        + ["--resume"]
    )
    if code != 0:
        return code
    print("[3/3] speculative decoding of held-out prompts (stdlib:heldout), greedy, depth 3")
    compare_drafters(target, args.output_dir / "final", args.eval_prompts)
    print(f"quickstart finished in {time.perf_counter() - t0:.0f} s; run directory: {args.output_dir}")
    return 0


def compare_drafters(target_dir: Path, medusa_dir: Path, num_prompts: int) -> None:
    """Evaluate the trained heads and the ngram baseline on the same prompts; print tau side by side and
    save the heads' report in their checkpoint (final/eval.json)."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate, write_json
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.target import FrozenTarget, TargetConfig

    target = FrozenTarget.load(TargetConfig(path=str(target_dir)))
    rows = []
    for drafter, tree in [
        (str(medusa_dir), "chain"),
        (str(medusa_dir), "topk:3"),
        ("ngram", "chain"),
        ("ngram", "topk:3"),
    ]:
        eval_args = EvalArgs(
            target=str(target_dir),
            drafter=drafter,
            data="stdlib:heldout",
            num_prompts=num_prompts,
            max_new_tokens=96,
            depth=3,
            tree=tree,
            check_lossless=True,
            progress=False,
        )
        report = evaluate(eval_args, target, load_drafter_spec(drafter, target))
        if drafter == str(medusa_dir) and tree == "chain":
            write_json(report, medusa_dir / "eval.json")
        name = "medusa (trained heads)" if drafter != "ngram" else "ngram (prompt lookup)"
        rows.append((name, tree, report))
    print("| drafter | tree | tau | alpha | speedup | lossless |")
    print("|---|---|---|---|---|---|")
    for name, tree, r in rows:
        print(
            f"| {name} | {tree} | {r['tau']:.3f} | {r['alpha']:.3f} | {r['speedup']:.2f} | {r['lossless']} |"
        )
    print(f"(tau = tokens per target forward, 1.00 = plain decoding; report: {medusa_dir / 'eval.json'})")
