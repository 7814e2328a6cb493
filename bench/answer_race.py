"""What bench/head_fold.py and bench/answer_cache.py share: one quickstart batch answered greedily by
`data regenerate`'s own `generate_batch` in two or more variants, in turn `--repeats` times (shared 2-core
machines vary by up to 30 % between runs, hence the medians); prints each variant's median wall time and
tokens/s, and how many answers equal the first variant's token for token."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

# A variant's set-up, given the loaded target: puts the target (or the generator) in that variant's state.
Variants = dict[str, Callable[[Any], None]]


def parser(doc: str | None, dtypes: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--data", default="prompts:train", help="a data source as `data regenerate --data` takes")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--dtypes", default=dtypes)
    p.add_argument("--repeats", type=int, default=3, help="runs of each, alternating (medians reported)")
    return p


def race(args: argparse.Namespace, variants_for: Callable[[Any], Variants]) -> None:
    """For each of `--dtypes`: the batch answered in every variant of `variants_for(target)`, in turn."""
    from draftsmith.data.regen_output import Sampling
    from draftsmith.scripts.data.regenerate_local import generate_batch

    sampling = Sampling(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens, seed=0)
    for dtype in args.dtypes.split(","):
        target, prompts, stop = quickstart_batch(args.target, dtype, args.data, args.batch)
        variants = variants_for(target)
        walls: dict[str, list[float]] = {name: [] for name in variants}
        answers: dict[str, list[list[int]]] = {}
        for _ in range(args.repeats):
            for name, set_up in variants.items():
                set_up(target)
                start = time.perf_counter()
                with torch.no_grad():
                    new = generate_batch(target.model, target.tokenizer, prompts, sampling, stop)
                walls[name].append(time.perf_counter() - start)
                answers[name] = [a for a, _ in new]
        first = next(iter(variants))
        tokens, width = sum(len(a) for a in answers[first]), max(len(q) for q in prompts)
        for name, runs in walls.items():
            wall = statistics.median(runs)
            print(
                f"{dtype} {name}: median {wall:.1f} s ({', '.join(f'{w:.1f}' for w in runs)}), {tokens} tokens, "
                f"{tokens / wall:.1f} tokens/s ({len(prompts)} prompts, widest {width} tokens)",
                flush=True,
            )
        for name in list(variants)[1:]:
            same = sum(a == b for a, b in zip(answers[first], answers[name], strict=True))
            print(f"{dtype}: {name} answers identical to {first}'s: {same} of {len(prompts)}", flush=True)


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
