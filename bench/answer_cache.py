r"""Greedy answers at a batch of 64 with the cache that appends in place and with transformers' concatenating
one (docs/BENCHMARKS.md, "Appending in place"): wall time, tokens/s and how many answers are identical token
for token.

    python -m bench.answer_cache --target DIR [--data prompts:train] [--batch 64] [--max-new-tokens 192] \
        [--dtypes float32] [--repeats 3]

The batch of bench/head_fold.py (the second that `data regenerate --target` cuts from `--data`, first turns),
answered by `regenerate_local.generate_batch` as `data regenerate` runs it, once with its growing cache
(`answer_cache`) and once with none passed (`generate` then builds transformers' `DynamicCache`), in turn
`--repeats` times (medians). Set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
for a CPU without AVX-512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench.head_fold import quickstart_batch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--data", default="prompts:train", help="a data source as `data regenerate --data` takes")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--repeats", type=int, default=3, help="runs of each, alternating (medians reported)")
    args = p.parse_args()

    from draftsmith.data.regen_output import Sampling
    from draftsmith.scripts.data import regenerate_local

    growing = regenerate_local.answer_cache
    variants = {"growing cache": growing, "concatenating": lambda model, room: {}}
    sampling = Sampling(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens, seed=0)
    for dtype in args.dtypes.split(","):
        target, prompts, stop = quickstart_batch(args.target, dtype, args.data, args.batch)
        walls: dict[str, list[float]] = {name: [] for name in variants}
        answers: dict[str, list[list[int]]] = {}
        for _ in range(args.repeats):
            for name, cache in variants.items():
                regenerate_local.answer_cache = cache  # generate_batch's cache, swapped in turn
                start = time.perf_counter()
                with torch.no_grad():
                    new = regenerate_local.generate_batch(
                        target.model, target.tokenizer, prompts, sampling, stop
                    )
                walls[name].append(time.perf_counter() - start)
                answers[name] = [a for a, _ in new]
        regenerate_local.answer_cache = growing
        tokens = sum(len(a) for a in answers["growing cache"])
        width = max(len(q) for q in prompts)
        for name, runs in walls.items():
            wall = statistics.median(runs)
            print(
                f"{dtype} {name}: median {wall:.1f} s ({', '.join(f'{w:.1f}' for w in runs)}), {tokens} tokens, "
                f"{tokens / wall:.1f} tokens/s ({len(prompts)} prompts, widest {width} tokens)",
                flush=True,
            )
        same = sum(a == b for a, b in zip(answers["growing cache"], answers["concatenating"], strict=True))
        print(f"{dtype}: identical answers {same} of {len(prompts)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
