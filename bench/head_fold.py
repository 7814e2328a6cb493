r"""Greedy answers at a batch of 64 with and without the LM head's stride fix (docs/BENCHMARKS.md, "The head's
copy in generate's prefill"): wall time, tokens/s and how many answers are identical token for token.

    python -m bench.head_fold --target DIR [--data prompts:train] [--batch 64] [--max-new-tokens 192] \
        [--dtypes bfloat16,float32] [--repeats 3]

One length-sorted batch of `--data` (the second that `data regenerate --target` would cut, first turns only),
answered by `regenerate_local.generate_batch` as `data regenerate` runs it: once as loaded (the head's
`foldable_input` pre-hook in place) and once with that hook removed, the state before it existed, in turn
`--repeats` times (shared 2-core machines vary by 30 % between runs). Set
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 for a CPU without AVX-512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--data", default="prompts:train", help="a data source as `data regenerate --data` takes")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument(
        "--repeats", type=int, default=3, help="runs of each, alternating (the median is reported)"
    )
    args = p.parse_args()

    from draftsmith.data.regen_output import Sampling
    from draftsmith.scripts.data.regenerate_local import generate_batch

    sampling = Sampling(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens, seed=0)
    for dtype in args.dtypes.split(","):
        target, prompts, stop = quickstart_batch(args.target, dtype, args.data, args.batch)
        tok = target.tokenizer
        width = max(len(q) for q in prompts)
        head = target.model.get_output_embeddings()
        hooks = dict(head._forward_pre_hooks)  # the fix, put back and taken out in turn
        answers: dict[bool, list[list[int]]] = {}
        walls: dict[bool, list[float]] = {True: [], False: []}
        tokens = 0
        for _ in range(args.repeats):
            for fixed in (True, False):
                head._forward_pre_hooks.clear()
                if fixed:
                    head._forward_pre_hooks.update(hooks)
                start = time.perf_counter()
                with torch.no_grad():
                    new = generate_batch(target.model, tok, prompts, sampling, stop)
                walls[fixed].append(time.perf_counter() - start)
                tokens = sum(len(a) for a, _ in new)
                answers[fixed] = [a for a, _ in new]
        for fixed in (True, False):
            wall = statistics.median(walls[fixed])
            runs = ", ".join(f"{w:.1f}" for w in walls[fixed])
            print(
                f"{dtype} {'head fix' if fixed else 'without '}: median {wall:.1f} s ({runs}), {tokens} tokens, "
                f"{tokens / wall:.1f} tokens/s ({len(prompts)} prompts, widest {width} tokens)",
                flush=True,
            )
        same = sum(a == b for a, b in zip(answers[True], answers[False], strict=True))
        print(f"{dtype}: identical answers {same} of {len(prompts)}", flush=True)
    return 0


def quickstart_batch(
    target_dir: str, dtype: str, data: str, size: int
) -> tuple[Any, list[list[int]], set[int]]:
    """`(target, prompts, stop ids)`: the target in `dtype` as `data regenerate --target` loads it, and the
    rendered first turns of the second length-sorted batch of `size` that it would cut from `data` (the only
    one of a small set)."""
    from transformers import GenerationConfig

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
    from draftsmith.scripts.data.regenerate_local import length_batches

    convs = read_conversations(data)
    batches = length_batches(convs, size, set())
    batch = batches[min(1, len(batches) - 1)]
    target = FrozenTarget.load(TargetConfig(path=target_dir, dtype=dtype))  # type: ignore[arg-type]  # --dtypes
    target.model.generation_config = GenerationConfig()
    prompts = [render_prompt(target.tokenizer, prompt_turns(convs[i])[0], convs[i].tools) for i in batch]
    return target, prompts, stop_token_ids(target)


if __name__ == "__main__":
    sys.exit(main())
