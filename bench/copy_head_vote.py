"""Does the copy head still copy after training? Its own vote, beside the drafter's output.

docs/BENCHMARKS.md, "Keeping the copy head: what training does to it". `draft.layer_init: copy` builds kv
group 0 of the EAGLE-3 draft layer as a copy head (src/draftsmith/models/copy_head.py); this reads that
group's step-0 attention directly: column t's attention weights, averaged over the group's query heads, vote
for the token each attended column j holds in its embedding half (x_{j+1}), and the vote's top token is
scored against the target's greedy token at the answer positions of a `draft.labels: top1` cache of copy
chats, as `bench.copy_tasks probe` scores the drafter's first step (shown beside it).

    python -m bench.copy_head_vote --target T --cache COPY_CACHE --drafter DIR [--drafter DIR ...] [--run RUN]

With `--run` (a training run's directory: its config.yaml and cache) the table adds the copy head as built
for that run, before any step, and each drafter again with fc's later-tap columns set back to the built ones
(the key reads the first tap; the later taps are what training grows).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.copy_ceiling import vote
from bench.copy_tasks import step_hits
from draftsmith.models.parts import shift_left
from draftsmith.models.target import TOP1, FrozenTarget, TargetConfig, feature_key
from draftsmith.runtime.display import fmt_value, table


@torch.no_grad()
def group_attention(model: Any, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`[T, T]`: kv group 0's causal attention weights at TTT step 0, averaged over its query heads, for one
    sample (`features [1, T, 3H]`, `ids [1, T]`), from the drafter's own `group_scores`."""
    scores = model.group_scores(model.project(features), shift_left(ids))[0]
    T = ids.shape[1]
    future = torch.ones(T, T, dtype=torch.bool, device=ids.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1).mean(0)


@torch.no_grad()
def head_and_drafter(model: Any, features: torch.Tensor, ids: torch.Tensor, vocab: int) -> list[torch.Tensor]:
    """`[T]` predictions of column t (target ids): kv group 0's vote, and the drafter's first step."""
    weights = group_attention(model, features, ids)
    n = ids.shape[1] - 1
    head = vote(weights[:n, :n], ids[0], vocab)
    own = model.to_target_ids(model.logits(model.unroll_hidden(features, ids)[0]).argmax(-1))[0]
    return [head, own]


def measure(model: Any, data: Any, layers: list[Any], samples: int, vocab: int) -> list[float]:
    """Top-1 against the target's greedy token over the first `samples` samples: [head vote, drafter]."""
    hits, counts = [0, 0], [0, 0]
    for i in range(min(samples, len(data))):
        item = data[i]
        features = torch.cat([item[feature_key(lid)] for lid in layers], -1)[None].float()
        predictions = head_and_drafter(model.eval(), features, item["input_ids"][None], vocab)
        for j, p in enumerate(predictions):
            h, c = step_hits([p], item[feature_key(TOP1)].long(), item["loss_mask"])
            hits[j] += h[0]
            counts[j] += c[0]
    return [h / max(c, 1) for h, c in zip(hits, counts, strict=True)]


def built_for(run: Path, target: FrozenTarget) -> Any:
    """The copy head `draft.layer_init: copy` builds for `run`'s config and cache, before training."""
    from draftsmith.config.loader import load_config
    from draftsmith.train.cache.store import FeatureCache
    from draftsmith.train.eagle import RECIPE, build_draft

    cfg = load_config(RECIPE, run / "config.yaml", ["draft.layer_init=copy"])
    if cfg.data.cache is None:
        raise ValueError(f"{run}: the run trained online; the copy head is fitted here from its cache")
    torch.manual_seed(cfg.seed)
    dataset = FeatureCache.open(cfg.data.cache, verify=False, progress=False).dataset("train")
    return build_draft(cfg, target, dataset)


def with_built_taps(model: Any, built: Any) -> Any:
    """A copy of `model` whose fc columns for the taps after the first are `built`'s."""
    out = copy.deepcopy(model)
    hidden = built.fc.weight.shape[0]
    with torch.no_grad():
        out.fc.weight[:, hidden:] = built.fc.weight[:, hidden:]
    return out


def run(target_dir: str, cache: Path, drafters: list[str], run_dir: Path | None, samples: int) -> list[str]:
    from draftsmith.models.checkpoint import load_drafter
    from draftsmith.train.cache.store import FeatureCache

    target = FrozenTarget.load(TargetConfig(path=target_dir), layers=0)
    opened = FeatureCache.open(cache, verify=False, progress=False)
    data, layers = opened.dataset("train"), [lid for lid in opened.layers if lid != TOP1]
    built = built_for(run_dir, target) if run_dir is not None else None
    arms: list[tuple[str, Any]] = [("copy head as built, untrained", built)] if built is not None else []
    for path in drafters:
        model, _ = load_drafter(path, target)
        arms.append((path, model))
        if built is not None:
            arms.append((f"{path}, fc's later taps as built", with_built_taps(model, built)))
    rows = []
    for name, model in arms:
        head, own = measure(model, data, layers, samples, target.vocab_size)
        rows.append([name, fmt_value(head), fmt_value(own)])
    return table(["drafter", "kv group 0's vote, top-1", "drafter's first step, top-1"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_head_vote",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--cache", type=Path, required=True, help="a draft.labels=top1 cache of copy chats")
    parser.add_argument(
        "--drafter", action="append", default=[], help="a trained EAGLE-3 drafter (repeatable)"
    )
    parser.add_argument("--run", type=Path, help="a training run whose copy head, as built, is measured too")
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args(argv)
    print("\n".join(run(args.target, args.cache, args.drafter, args.run, args.samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
