"""MTP depth sweep: tau of D = 1..3 MTP modules on the toy target (docs/BENCHMARKS.md).

    python -m bench.bench_mtp --target DIR --out DIR [--depths 1 2 3] [--num-prompts 20]

Each D trains `recipes/mtp/toy.yaml` with `draft.num_modules=D` (same data and steps for every D), then is
measured by real speculative decoding, a chain of D, on held-out prompts at T=0 and T=1. One JSON line per
D goes to OUT/mtp.json as it finishes; a rerun skips finished depths.

Feeds docs/BENCHMARKS.md, "MTP modules on the `small` toy target".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="toy target directory (small preset)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train import mtp

    repo = Path(__file__).resolve().parents[1]
    target = FrozenTarget.load(TargetConfig(path=args.target))
    results = args.out / "mtp.json"
    done = (
        {json.loads(line)["D"] for line in results.read_text().splitlines()} if results.is_file() else set()
    )
    for D in args.depths:
        if D in done:
            continue
        run = args.out / f"mtp{D}"
        t0 = time.perf_counter()
        mtp.main(
            [
                "--config",
                str(repo / "recipes" / "mtp" / "toy.yaml"),
                f"target.path={args.target}",
                f"output_dir={run}",
                f"draft.num_modules={D}",
                "checkpoint.every=0",
            ]
        )
        row: dict = {"D": D, "train_s": time.perf_counter() - t0}
        heldout = json.loads((run / "final" / "config.json").read_text())["training"]["heldout"]
        row["agree"] = [heldout.get(f"eval/depth{k}/agree") for k in range(1, D + 1)]
        row["tau_estimate"] = heldout.get("eval/tau_estimate")
        drafter = load_drafter_spec(str(run / "final"), target)
        for temperature in (0.0, 1.0):
            r = evaluate(
                EvalArgs(
                    target=args.target,
                    drafter=str(run / "final"),
                    data="stdlib:heldout",
                    num_prompts=args.num_prompts,
                    max_new_tokens=args.max_new_tokens,
                    depth=D,
                    temperature=temperature,
                    baseline=temperature == 0,
                    check_lossless=temperature == 0,
                    progress=False,
                ),
                target,
                drafter,
            )
            row[f"tau_T{temperature:g}"] = r["tau"]
            row[f"tau_stderr_T{temperature:g}"] = r["tau_stderr"]
            if temperature == 0:
                row["lossless"], row["speedup_T0"] = r["lossless"], r["speedup"]
        print(json.dumps(row), flush=True)
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
