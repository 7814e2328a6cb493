"""Does a drafter copy where copying is right? Its first step split by whether a copy source exists.

docs/BENCHMARKS.md, "Teaching the head where to look". On the held-out split of an EAGLE-3 feature cache
(`draft.labels: data`, the target's own answers), each column t that training's first step counts is a copy row when some earlier column
j <= t holds x_j = x_{t+1} and x_{j+1} = x_{t+2} (train/prompt_lookup.py `copy_columns`: a one-token lookup,
choosing well, would draft the label), else an other row. For each drafter: its first step's top-1 against
x_{t+2} on both kinds of row, and on the copy rows how often kv group 0's attention (its query heads averaged)
peaks on a source.

    python -m bench.copy_rows --target T --cache CACHE --drafter DIR [--drafter DIR ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch

from bench.copy_head_vote import group_attention
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


def run(target_dir: str, cache: str, drafters: list[str]) -> list[str]:
    from draftsmith.models.checkpoint import load_drafter
    from draftsmith.train.cache.store import FeatureCache

    target = FrozenTarget.load(TargetConfig(path=target_dir), layers=0)
    opened = FeatureCache.open(cache, verify=False, progress=False)
    data, layers = opened.dataset("eval"), [lid for lid in opened.layers if lid != TOP1]
    rows = []
    for path in drafters:
        model, _ = load_drafter(path, target)
        totals = [0] * 5
        for i in range(len(data)):
            item = data[i]
            features = torch.cat([item[feature_key(lid)] for lid in layers], -1)[None].float()
            ids = item["input_ids"][None]
            batch = {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "loss_mask": item["loss_mask"][None],
            }
            counted = step_masks(batch, 1)[0][0] & (data_labels(batch, 0)[0] >= 0)
            got = count_rows(model.eval(), features, ids, counted)
            totals = [a + b for a, b in zip(totals, got, strict=True)]
        copies, copy_hits, peaks, others, other_hits = totals
        rows.append(
            [
                path,
                copies,
                fmt_value(copy_hits / max(copies, 1)),
                fmt_value(peaks / max(copies, 1)),
                others,
                fmt_value(other_hits / max(others, 1)),
            ]
        )
    header = ["drafter", "copy rows", "first-step top-1", "group 0 peaks on a source", "other rows", "top-1"]
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
    args = parser.parse_args(argv)
    print("\n".join(run(args.target, args.cache, args.drafter)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
