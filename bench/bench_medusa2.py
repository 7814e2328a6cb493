"""Medusa-2 against Medusa-1 on the toy target: tau and the adapted target's drift (docs/BENCHMARKS.md).

    draftsmith train medusa --config recipes/medusa/toy.yaml target.path=$T output_dir=$M1 draft.num_heads=5
    draftsmith train medusa --config recipes/medusa/medusa2_toy.yaml target.path=$T output_dir=$M2
    python -m bench.bench_medusa2 --target $T --medusa1 $M1/final --medusa2 $M2/final --out FILE

Both are measured by real speculative decoding on the same held-out prompts (chain and topk:3 at depth 5, T=0
and T=1). Medusa-2 decodes with its adapted target (the adapter merged), so its report carries
`adapter_drift`: KL(original || adapted) per token over the original's greedy answers, and how many greedy
answers changed.

Feeds docs/BENCHMARKS.md, "Medusa-2 against Medusa-1 on the `small` toy target".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--medusa1", required=True, help="Medusa-1 checkpoint (final/)")
    p.add_argument("--medusa2", required=True, help="Medusa-2 checkpoint (final/ with adapter/)")
    p.add_argument("--out", type=Path, required=True, help="JSON results")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args(argv)

    from draftsmith.eval.acceptance import EvalArgs, evaluate

    rows = []
    for name, ckpt in (("medusa1", args.medusa1), ("medusa2", args.medusa2)):
        for temperature in (0.0, 1.0):
            for tree in ("chain", "topk:3"):
                r = evaluate(
                    EvalArgs(
                        target=args.target,
                        drafter=ckpt,
                        data="stdlib:heldout",
                        num_prompts=args.num_prompts,
                        max_new_tokens=args.max_new_tokens,
                        depth=5,
                        tree=tree,
                        temperature=temperature,
                        baseline=temperature == 0,
                        check_lossless=temperature == 0,
                        progress=False,
                    )
                )
                row = {
                    "drafter": name,
                    "T": temperature,
                    "tree": tree,
                    "tau": r["tau"],
                    "tau_stderr": r["tau_stderr"],
                    "lossless": r["lossless"],
                    "speedup": r["speedup"],
                    "adapter_drift": r.get("adapter_drift"),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
