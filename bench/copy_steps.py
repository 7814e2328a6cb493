"""Step by step, a drafter beside prompt lookup on the same contexts: does it accept where copying would?

    python -m bench.copy_steps --target DIR --drafter CKPT --data SET.jsonl [--num-prompts 15] \
        [--max-new-tokens 96] [--out steps.json]

Decodes the set with the drafter (a chain of depth 5, T = 0, the evaluator's own loop) and, at every
verification step, asks prompt lookup (the evaluator's ngram drafter, 1-3-grams, latest match) what it would
have drafted from the same context, and how many of those tokens the target's answer confirms. Greedy answers
do not depend on the drafter, so both drafters are scored against the same continuation. The table groups the
steps by prompt lookup's count: where it would accept all five tokens (the answer copying earlier text) a
drafter that has learnt to copy accepts far more than at the steps where nothing is copied; `docs/BENCHMARKS.md`
("Acceptance per token") shows one that did not. Also each group's conditional acceptance by depth (of the
steps that reached depth d, the share accepted there) and the tokens per step of the better of the two per
step (the ceiling of a perfect chooser between them).

Feeds docs/BENCHMARKS.md, "Teaching the chat drafter to copy".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.runtime.display import table as md_table

DEPTH = 5


def accepted_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of `draft` the greedy continuation `truth` confirms."""
    n = 0
    for a, b in zip(draft, truth, strict=False):
        if a != b:
            break
        n += 1
    return n


def step_rows(turns: Sequence[Any], depth: int = DEPTH) -> list[dict[str, int]]:
    """One row per verification step of every answer: the drafter's accepted tokens and prompt lookup's on the
    same context (the prompt and the answer's tokens committed so far; the prefill commits the first)."""
    from draftsmith.eval.drafters.ngram import NgramDrafter

    lookup = NgramDrafter()
    rows = []
    for turn in turns:
        tokens, done = turn.spec.tokens, 1
        for step in turn.spec.steps:
            context = [*turn.prompt, *tokens[:done]]
            drafts = lookup.continuations(context, depth, 1)
            ngram = accepted_prefix(drafts[0], tokens[done : done + depth]) if drafts else 0
            rows.append({"drafter": step.accepted, "ngram": ngram})
            done += step.committed
    return rows


def group(rows: Sequence[dict[str, int]], depth: int = DEPTH) -> dict[str, Any]:
    """Steps, mean accepted tokens of each drafter and of the better one, and the drafter's conditional
    acceptance at depths 1..depth (None where no step reached that depth)."""
    n = len(rows)
    by_depth: list[float | None] = []
    for d in range(depth):
        reached = [r for r in rows if r["drafter"] >= d]
        by_depth.append(sum(r["drafter"] > d for r in reached) / len(reached) if reached else None)
    return {
        "steps": n,
        "drafter": sum(r["drafter"] for r in rows) / n if n else None,
        "ngram": sum(r["ngram"] for r in rows) / n if n else None,
        "better": sum(max(r["drafter"], r["ngram"]) for r in rows) / n if n else None,
        "drafter_by_depth": by_depth,
    }


def table(rows: Sequence[dict[str, int]], depth: int = DEPTH) -> dict[str, dict[str, Any]]:
    """All steps, then the steps grouped by prompt lookup's accepted count (0..depth)."""
    out = {"all": group(rows, depth)}
    for k in range(depth + 1):
        out[f"ngram accepts {k}"] = group([r for r in rows if r["ngram"] == k], depth)
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(groups: dict[str, dict[str, Any]]) -> str:
    header = [
        "steps",
        "count",
        "drafter accepts",
        "prompt lookup would",
        "better of the two",
        "drafter by depth 1..5",
    ]
    rows = [
        [name, g["steps"], _fmt(g["drafter"]), _fmt(g["ngram"]), _fmt(g["better"])]
        + [" ".join(_fmt(a) for a in g["drafter_by_depth"])]
        for name, g in groups.items()
    ]
    return "\n".join(md_table(header, rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="the target's directory")
    parser.add_argument("--drafter", required=True, help="the drafter's checkpoint (a run's final/)")
    parser.add_argument(
        "--data", required=True, help="the prompts (e.g. ../shared/data/mt_bench/question.jsonl)"
    )
    parser.add_argument("--num-prompts", type=int, default=15)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, help="also write the per-step rows and the table here (JSON)")
    args = parser.parse_args(argv)
    from draftsmith.eval.acceptance import evaluate, parse

    turns: list[Any] = []
    report = evaluate(
        parse(
            [
                *("--target", args.target, "--drafter", args.drafter, "--data", args.data),
                *("--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens)),
                *("--depth", str(DEPTH), "--tree", "chain", "--dtype", "float32", "--no-progress"),
            ]
        ),
        record=turns,
    )
    rows = step_rows(turns)
    groups = table(rows)
    print(f"tau {report['tau']:.3f} over {len(turns)} answers, {len(rows)} steps")
    print(markdown(groups))
    if args.out:
        args.out.write_text(json.dumps({"tau": report["tau"], "table": groups, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
