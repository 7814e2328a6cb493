r"""The target's answers compiled or not (docs/BENCHMARKS.md, "Compiled or not, stage by stage"): `data
regenerate`'s own `generate_batch`, once as it runs by default on a CPU (eager, the growing cache) and once
with `--compile on` (transformers' static cache, its forward through torch.compile), on the same batches.

    python -m bench.compile_answers --target DIR [--dtype bfloat16] [--batches 3] [--batch-size 64] \
        [--max-new-tokens 192]

The first `--batches` x `--batch-size` built-in `prompts:train` prompts, greedy. The first batch of each
variant is timed on its own (the compiled one pays its compilation there); tokens/s is over the later batches.
Both variants' answers are compared token for token. Then the cache stage's work on the same texts: the
target's forward over each prompt + answer (batches of --prefill-batch, right-padded, every hidden state out),
eager and through `torch.compile(dynamic=True)`, tokens/s after the first batch, and the largest difference of
the final hidden state.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--prefill-batch", type=int, default=8)
    args = p.parse_args()

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations
    from draftsmith.data.regen_output import Sampling
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
    from draftsmith.runtime.display import table
    from draftsmith.scripts.data.regenerate_local import generate_batch

    target = FrozenTarget.load(TargetConfig(path=args.target, dtype=args.dtype))
    convs = read_conversations("prompts:train", "auto", args.batches * args.batch_size)
    prompts = [render_prompt(target.tokenizer, prompt_turns(c)[0], c.tools) for c in convs]
    batches = [prompts[k : k + args.batch_size] for k in range(0, len(prompts), args.batch_size)]
    sampling = Sampling(0.0, 1.0, 0, args.max_new_tokens, 0)
    stop = stop_token_ids(target)
    rows, answers = [], {}
    for name, compiled in (("eager, growing cache", False), ("compiled, static cache", True)):
        times, tokens, out = [], [], []
        for batch in batches:
            start = time.perf_counter()
            with torch.no_grad():
                new = generate_batch(target.model, target.tokenizer, batch, sampling, stop, compiled=compiled)
            times.append(time.perf_counter() - start)
            tokens.append(sum(len(t) for t, _ in new))
            out += [t for t, _ in new]
        answers[name] = out
        steady = sum(tokens[1:]) / sum(times[1:]) if len(times) > 1 else float("nan")
        rows.append((name, f"{times[0]:.1f}", f"{tokens[0] / times[0]:.0f}", f"{steady:.0f}"))
        print(f"{name}: batches {[round(t, 1) for t in times]} s, tokens {tokens}", flush=True)
    print("\n".join(table(["variant", "first batch s", "first tok/s", "later tok/s"], rows)))
    first, second = answers.values()
    same = sum(a == b for a, b in zip(first, second, strict=True))
    print(f"identical answers: {same} of {len(first)} ({args.dtype}, {torch.get_num_threads()} threads)")
    texts = [p + a for p, a in zip(prompts, first, strict=True)]
    print("\n".join(prefill_table(target.model, texts, args.prefill_batch)))
    return 0


def prefill_table(model: torch.nn.Module, texts: list[list[int]], batch: int) -> list[str]:
    """The cache stage's forward (every hidden state) over `texts`, eager and compiled: tokens/s after the first
    batch, and the largest difference of the last hidden state between the two."""
    from draftsmith.runtime.display import table

    batches = [texts[k : k + batch] for k in range(0, len(texts), batch)]
    compiled = torch.compile(model, dynamic=True)
    rows, last = [], {}
    for name, forward in (("eager", model), ("torch.compile(dynamic=True)", compiled)):
        times, tokens, outs = [], [], []
        for rows_ in batches:
            width = max(len(r) for r in rows_)
            ids = torch.tensor([r + [0] * (width - len(r)) for r in rows_])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows_])
            start = time.perf_counter()
            with torch.no_grad():
                out = forward(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            times.append(time.perf_counter() - start)
            tokens.append(int(mask.sum()))
            outs.append(out.hidden_states[-1][mask.bool()].float())
        last[name] = torch.cat(outs)
        rate = sum(tokens[1:]) / sum(times[1:])
        rows.append((name, f"{times[0]:.1f}", f"{rate:.0f}"))
    diff = (last["eager"] - last["torch.compile(dynamic=True)"]).abs().max().item()
    lines = table(["cache stage forward", "first batch s", "later tok/s"], rows)
    return [*lines, f"largest difference of the last hidden state: {diff:.2e}"]


if __name__ == "__main__":
    sys.exit(main())
