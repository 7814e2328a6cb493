"""How much of a set of answers is copying: the share of answer tokens prompt lookup predicts.

    python -m bench.copy_share --target DIR --answers answers.jsonl [--limit 600]

For each conversation (the chat format `draftsmith data regenerate` writes), the last assistant answer's tokens
inside the target's chat template, and at each of them whether prompt lookup (1-3-grams, latest earlier
occurrence in the conversation so far: train/prompt_lookup.py, the evaluator's ngram drafter) would draft it.
`draft.copy_weight` weights exactly these positions; a high share with a drafter that does not copy
(`bench.copy_steps`) says the copies were in the data and the drafter did not learn them.

Feeds docs/BENCHMARKS.md, "Teaching the chat drafter to copy".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch


def answer_copies(ids: Sequence[int], answer_start: int) -> tuple[int, int]:
    """`(answer tokens, those prompt lookup drafts)` for one conversation's token ids whose answer starts at
    `answer_start` (each token after the first is drafted from all the tokens before it)."""
    from draftsmith.train.prompt_lookup import lookup_next

    drafted = lookup_next(torch.tensor([list(ids)]), torch.tensor([len(ids)]))[0].tolist()
    hits = sum(drafted[p - 1] == ids[p] for p in range(max(answer_start, 1), len(ids)))
    return len(ids) - max(answer_start, 1), hits


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_share",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target", required=True, help="the target's directory (its tokenizer and chat template)"
    )
    parser.add_argument("--answers", type=Path, required=True, help="conversations, one JSON object a line")
    parser.add_argument("--limit", type=int, default=600, help="the first this many conversations")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target)
    tokens = hits = 0
    with args.answers.open() as f:
        for n, line in enumerate(f):
            if n >= args.limit:
                break
            messages = json.loads(line)["messages"]
            if messages[-1]["role"] != "assistant":
                continue
            prompt = str(tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True))
            full = str(tok.apply_chat_template(messages, tokenize=False))
            if not full.startswith(prompt):
                raise SystemExit(f"{args.answers}:{n + 1}: the chat template does not extend the prompt")
            start = len(tok(prompt, add_special_tokens=False)["input_ids"])
            t, h = answer_copies(tok(full, add_special_tokens=False)["input_ids"], start)
            tokens, hits = tokens + t, hits + h
    print(
        f"{tokens:,} answer tokens (template's closing tokens included), prompt lookup drafts {hits:,}: {hits / max(tokens, 1):.1%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
