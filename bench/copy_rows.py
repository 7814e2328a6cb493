"""Does a drafter copy where copying is right? Its first step split by whether a copy source exists.

docs/BENCHMARKS.md, "Teaching the head where to look". On the held-out split of an EAGLE-3 feature cache
(`draft.labels: data`, the target's own answers), each column t that training's first step counts is a copy row when some earlier column
j <= t holds x_j = x_{t+1} and x_{j+1} = x_{t+2} (train/prompt_lookup.py `copy_columns`: a one-token lookup,
choosing well, would draft the label), else an other row. For each drafter: its first step's top-1 against
x_{t+2} on both kinds of row, and on the copy rows how often kv group 0's attention (its query heads averaged)
peaks on a source.

With `--steps`, every TTT step s instead: column t's query stands for x_{t+s+1} and its label is x_{t+s+2}; it is
a copy row when a step-0 column j <= t is a source for them (the keys step s reads besides its own diagonal).
Each step is counted twice: over all its rows (teacher-forced), and over the rows a chain reaches (steps 0..s-1
right at that column, as in decoding).

    python -m bench.copy_rows --target T --cache CACHE --drafter DIR [--drafter DIR ...] [--steps]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch

from bench.copy_head_vote import group_attention
from draftsmith.models.parts import shift_left
from draftsmith.models.target import TOP1, FrozenTarget, TargetConfig, feature_key
from draftsmith.runtime.display import fmt_value, table
from draftsmith.train.eagle import step_masks
from draftsmith.train.eagle_chunks import data_labels
from draftsmith.train.prompt_lookup import copy_columns


@torch.no_grad()
def count_rows(model: Any, features: torch.Tensor, ids: torch.Tensor, counted: torch.Tensor) -> list[int]:
    """`[copy rows, their first-step hits, their head peaks on a source, other rows, their hits]` of one sample
    (`features [1, T, 3H]`, `ids [1, T]`, `counted [T]` the columns training's first step counts there)."""
    hidden = model.unroll_hidden(features, ids)[0]
    predicted = model.to_target_ids(model.logits(hidden).argmax(-1))[0]
    peaks = group_attention(model, features, ids).argmax(-1)
    sources = copy_columns(ids, torch.ones_like(ids))[0]
    hit = predicted == data_labels({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 0)[0]
    copy = sources.any(-1) & counted
    other = ~sources.any(-1) & counted
    on_source = sources.gather(-1, peaks[:, None])[:, 0]
    return [
        int(copy.sum()),
        int((hit & copy).sum()),
        int((on_source & copy).sum()),
        int(other.sum()),
        int((hit & other).sum()),
    ]


@torch.no_grad()
def count_step_rows(
    model: Any, features: torch.Tensor, ids: torch.Tensor, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    """`[steps, 2, 5]`: per TTT step, over all counted columns and over those a chain reaches, the counts
    `count_rows` gives (copy rows, their hits, their peaks on a source, other rows, their hits)."""
    steps = model.config.ttt_steps
    hiddens = model.unroll_hidden(features, ids)
    # [u, j]: the sources of the column whose query is x_{u+1}
    sources = copy_columns(ids, torch.ones_like(ids))[0]
    T = ids.shape[1]
    earlier = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    first, first_ids = model.project(features), shift_left(ids)
    step_ids, reached = first_ids, torch.ones(T, dtype=torch.bool, device=ids.device)
    out = torch.zeros(steps, 2, 5, dtype=torch.long)
    for s, masked in enumerate(step_masks(batch, steps)):
        query = None if s == 0 else (hiddens[s - 1], step_ids, s)
        scores = model.group_scores(first, first_ids, query=query)[0]
        peaks = scores.masked_fill(~earlier, float("-inf")).softmax(-1).mean(0).argmax(-1)
        own = torch.zeros(T, T, dtype=torch.bool, device=ids.device)
        own[: T - s] = sources[s:]
        own &= earlier  # step s reads the step-0 columns j <= t
        label = data_labels(batch, s)[0]
        hit = model.to_target_ids(model.logits(hiddens[s]).argmax(-1))[0] == label
        counted = masked[0] & (label >= 0)
        copy, on_source = own.any(-1), own.gather(-1, peaks[:, None])[:, 0]
        for k, rows in enumerate((counted, counted & reached)):
            out[s, k] = torch.stack(
                [
                    (copy & rows).sum(),
                    (hit & copy & rows).sum(),
                    (on_source & copy & rows).sum(),
                    (~copy & rows).sum(),
                    (hit & ~copy & rows).sum(),
                ]
            )
        reached &= hit
        step_ids = shift_left(step_ids)
    return out


def _row(name: str, counts: list[int]) -> list[Any]:
    copies, copy_hits, peaks, others, other_hits = counts
    return [
        name,
        copies,
        fmt_value(copy_hits / max(copies, 1)),
        fmt_value(peaks / max(copies, 1)),
        others,
        fmt_value(other_hits / max(others, 1)),
    ]


def run(target_dir: str, cache: str, drafters: list[str], steps: bool = False) -> list[str]:
    from draftsmith.models.checkpoint import load_drafter
    from draftsmith.train.cache.store import FeatureCache

    target = FrozenTarget.load(TargetConfig(path=target_dir), layers=0)
    opened = FeatureCache.open(cache, verify=False, progress=False)
    data, layers = opened.dataset("eval"), [lid for lid in opened.layers if lid != TOP1]
    rows = []
    for path in drafters:
        model, _ = load_drafter(path, target)
        totals, per_step = [0] * 5, torch.zeros(model.config.ttt_steps, 2, 5, dtype=torch.long)
        for i in range(len(data)):
            item = data[i]
            features = torch.cat([item[feature_key(lid)] for lid in layers], -1)[None].float()
            ids = item["input_ids"][None]
            batch = {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "loss_mask": item["loss_mask"][None],
            }
            if steps:
                per_step += count_step_rows(model.eval(), features, ids, batch)
                continue
            counted = step_masks(batch, 1)[0][0] & (data_labels(batch, 0)[0] >= 0)
            got = count_rows(model.eval(), features, ids, counted)
            totals = [a + b for a, b in zip(totals, got, strict=True)]
        if not steps:
            rows.append(_row(path, totals))
        for s in range(per_step.shape[0] if steps else 0):
            rows.append(_row(f"{path} step {s}", per_step[s, 0].tolist()))
            rows.append(_row(f"{path} step {s}, reached", per_step[s, 1].tolist()))
    header = ["drafter", "copy rows", "top-1", "group 0 peaks on a source", "other rows", "top-1"]
    if not steps:
        header[2] = "first-step top-1"
    return table(header, rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_rows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--cache", required=True, help="an EAGLE-3 feature cache with a held-out split")
    parser.add_argument("--drafter", action="append", required=True, help="a trained EAGLE-3 drafter")
    parser.add_argument(
        "--steps", action="store_true", help="every TTT step, all rows and the rows a chain reaches"
    )
    args = parser.parse_args(argv)
    print("\n".join(run(args.target, args.cache, args.drafter, args.steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
