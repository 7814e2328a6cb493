r"""Greedy answers of a target in float32 and in bfloat16 (docs/BENCHMARKS.md, "The quickstart on
SmolLM2-135M-Instruct"): wall time, tokens/s, and how many answers are identical token for token.

    python -m bench.bf16_answers --target DIR [--prompts 32] [--max-new-tokens 96]

The first `--prompts` built-in `prompts:train` prompts, rendered with the target's chat template, left-padded
into one batch and answered by transformers' `generate` (greedy), once with the weights in each dtype.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (draftsmith build-target)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.runtime.tokens import left_pad

    convs = read_conversations("prompts:train", "auto", args.prompts)
    answers = {}
    for dtype in ("float32", "bfloat16"):
        target = FrozenTarget.load(TargetConfig(path=args.target, dtype=dtype))
        tok = target.tokenizer
        prompts = [render_prompt(tok, prompt_turns(c)[0], c.tools) for c in convs]
        ids, mask = left_pad(prompts, tok.pad_token_id, target.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = target.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        wall = time.perf_counter() - start
        new = out[:, ids.shape[1] :]
        tokens = int((new != tok.pad_token_id).sum())
        print(f"{dtype}: {wall:.1f} s, {tokens} new tokens, {tokens / wall:.0f} tokens/s")
        answers[dtype] = new
    same = int((answers["float32"] == answers["bfloat16"]).all(dim=1).sum())
    print(f"identical answers: {same} of {len(convs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
