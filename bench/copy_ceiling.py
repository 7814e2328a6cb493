"""How well can one attention head copy from what an EAGLE-3 draft layer is given? The copy mechanism's ceiling.

docs/BENCHMARKS.md, "What one draft layer can copy: the keys EAGLE-3's inputs give". Column t of an EAGLE-3 draft
layer holds the target's features g_t and the embedding of the NEXT token x_{t+1}, and predicts x_{t+2}.
Copying (prompt lookup's gain) is one attention step: find an earlier position i with x_i = x_{t+1} and emit
x_{i+1}. Column i's embedding half holds x_{i+1}, the value to emit; its key must say which token x_i is, and in
EAGLE-3's inputs only the target's features g_i say that.

    python -m bench.copy_ceiling --fit-cache CHAT_CACHE --cache COPY_CACHE --samples 20 --target T

For every answer position of `--cache` (a `draft.labels: top1` cache of copy chats) this measures, against the
target's greedy token as `bench.copy_tasks probe` does for a trained drafter's first step:
- `lookup`: the token after the last earlier occurrence of x_{t+1} (a one-token prompt lookup);
- one untrained attention head (`head_dim` dims, a seeded random projection of the embedding space for query and
  key, the best of a few sharpnesses) that matches the query x_{t+1} against each column's key and votes for the
  columns' next tokens, with two kinds of key: `token`, x_i's own embedding (the identity a layout would give
  if it fed each column its current token), and `features`, a linear read of g_i (ridge regression from the
  taps of `--fit-cache` to the embedding of the token at the same position: the best a linear key of the
  features does on average), each without positions, with the target's rotary embedding over all the head's
  dimensions, and in the dimensions whose rotation stays under half a radian over the sample.
The vote is an upper bound of what the head's value and output projection can write, so each figure is a
ceiling of the matching alone; one more row reads the features' keys in the stable dimensions through a value
of `head_dim` dims (the next token's centred embedding in a seeded orthonormal basis) and the target's own
output head, as an untrained head built into the draft layer would.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from bench.copy_tasks import step_hits
from draftsmith.models.copy_head import ridge_read, stable_dims
from draftsmith.models.target import TOP1, LayerId, feature_key
from draftsmith.runtime.display import fmt_value, table

SHARPNESS = (10.0, 30.0, 100.0)
POSITIONS = ("none", "rope", "stable")


@dataclass
class KeySpace:
    """One head's fixed parts: the target's input embedding `[V, H]` and output head `[V, H]`, the token map
    from features to the embedding space `[F, H]`, the query/key projection `[H, d]`, an orthonormal value
    basis `[H, d]` and the rotary base."""

    emb: torch.Tensor
    head: torch.Tensor
    token_map: torch.Tensor
    proj: torch.Tensor
    value_basis: torch.Tensor
    theta: float

    def values(self, centred: torch.Tensor) -> torch.Tensor:
        """`[V, H]`: each token's value, its centred embedding kept in the value dimensions."""
        return centred @ self.value_basis @ self.value_basis.T


def fit_token_map(
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]], emb: torch.Tensor, ridge: float
) -> torch.Tensor:
    """`[F, H]` ridge map, without intercept, from features to the centred embedding of the token at the same
    position, over `(features [N, F], ids [N])` chunks (a draft layer's keys are linear in the features, with
    no bias). The features are scaled per column for the penalty (massive activations would otherwise own it)
    and the scale is folded back into the map."""
    centred = (emb - emb.mean(0)).double()
    gram = cross = None
    n = 0
    for x, ids in chunks:
        x = x.double()
        gram = x.T @ x if gram is None else gram + x.T @ x
        cross = x.T @ centred[ids] if cross is None else cross + x.T @ centred[ids]
        n += len(x)
    if gram is None or cross is None:
        raise ValueError("no features to fit the token map on")
    return ridge_read(gram, cross, n, ridge).float()


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of `x [T, D]` at `positions [T]` through transformers' own `apply_rotary_pos_emb`
    (Llama's layout: dims i and i + D/2 share a frequency theta^(-2i/D))."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = positions[:, None].double() * freq[None]
    angle = torch.cat([angle, angle], -1)
    turned, _ = apply_rotary_pos_emb(x.double()[:, None], x.double()[:, None], angle.cos(), angle.sin())
    return turned[:, 0].to(x.dtype)


def lookup_predictions(ids: torch.Tensor) -> torch.Tensor:
    """`[T]`: at column t the token after the last occurrence of ids[t+1] at a position <= t, else -1."""
    last: dict[int, int] = {}
    out = torch.full_like(ids, -1)
    for t in range(len(ids) - 1):
        last[int(ids[t])] = t
        seen = last.get(int(ids[t + 1]), -1)
        if 0 <= seen < t + 1:
            out[t] = ids[seen + 1]
    return out


def copy_weights(keys: torch.Tensor, queries: torch.Tensor, sharpness: float) -> torch.Tensor:
    """`[T-1, T-1]`: column t's attention, softmax(sharpness * cos), over the columns j <= t whose next token
    exists (rows and columns up to T-2). Keys and queries are compared by cosine: only directions count."""
    k = torch.nn.functional.normalize(keys, dim=-1)
    q = torch.nn.functional.normalize(queries, dim=-1)
    T = len(keys)
    scores = (q[: T - 1] @ k[: T - 1].T) * sharpness
    return scores.masked_fill(torch.ones(T - 1, T - 1, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def vote(weights: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[T]`: each column's prediction when column j votes for ids[j+1] with its weight (-1 at the last)."""
    n = len(weights)
    votes = torch.zeros(n, vocab, dtype=weights.dtype)
    votes.scatter_add_(1, ids[1 : n + 1].expand(n, n), weights)
    return torch.cat([votes.argmax(-1), torch.full((1,), -1, dtype=ids.dtype)])


def readout(
    weights: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, head: torch.Tensor
) -> torch.Tensor:
    """`[T]`: each column's prediction when column j's value `values[ids[j+1]]` (the next token's embedding
    in the head's value dimensions, mapped back to the hidden size) is averaged by weight and read by the
    target's output head `head [V, H]` (-1 at the last column)."""
    n = len(weights)
    logits = (weights @ values[ids[1 : n + 1]]) @ head.T
    return torch.cat([logits.argmax(-1), torch.full((1,), -1, dtype=ids.dtype)])


def head_views(
    key_space: torch.Tensor, query_space: torch.Tensor, proj: torch.Tensor, theta: float
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """`(positions, keys, queries)` of one head for each treatment of positions in POSITIONS."""
    k, q = key_space @ proj, query_space @ proj
    pos = torch.arange(len(k))
    yield "none", k, q
    yield "rope", rotate(k, pos, theta), rotate(q, pos, theta)
    keep = stable_dims(proj.shape[1], theta, len(k)).to(k.dtype)
    yield "stable", rotate(k * keep, pos, theta), rotate(q * keep, pos, theta)


def measure_sample(
    item: dict[str, torch.Tensor], features: torch.Tensor, space: KeySpace
) -> dict[str, tuple[int, int]]:
    """`{variant: (hits, counts)}` of one cached sample at its answer positions (step 0 of `step_hits`).

    Column t's query is the embedding of ids[t+1] (the layout's embedding half); column j's key stands for x_j
    through its own embedding (`token`) or the features' linear read (`features`)."""
    ids, top1, answer = item["input_ids"].long(), item["top1"].long(), item["loss_mask"].bool()
    centred = space.emb - space.emb.mean(0)
    queries = torch.cat([centred[ids[1:]], centred[:1] * 0])
    out = {"lookup (one token)": step_hits([lookup_predictions(ids)], top1, answer)}
    for name, key_space in (("token", centred[ids]), ("features", features @ space.token_map)):
        for positions, k, q in head_views(key_space, queries, space.proj, space.theta):
            weighted = [copy_weights(k, q, s) for s in SHARPNESS]
            counted = [step_hits([vote(w, ids, len(centred))], top1, answer) for w in weighted]
            best = max(range(len(SHARPNESS)), key=lambda i: counted[i][0][0])
            out[f"{name} / {positions} / vote"] = counted[best]
            if name == "features" and positions == "stable":
                predicted = readout(weighted[best], ids, space.values(centred), space.head)
                out[f"{name} / {positions} / value of {space.proj.shape[1]} dims"] = step_hits(
                    [predicted], top1, answer
                )
    return {name: (hits[0], counts[0]) for name, (hits, counts) in out.items()}


def _cached(cache: Path) -> tuple[Any, list[LayerId]]:
    from draftsmith.train.cache.store import FeatureCache

    opened = FeatureCache.open(cache, verify=False, progress=False)
    return opened.dataset("train"), [lid for lid in opened.layers if lid != TOP1]


def _features(item: dict[str, torch.Tensor], layers: list[LayerId]) -> torch.Tensor:
    return torch.cat([item[feature_key(lid)].float() for lid in layers], -1)


def fit_from_cache(
    cache: Path, emb: torch.Tensor, tokens: int, ridge: float
) -> tuple[torch.Tensor, list[LayerId]]:
    """The token map fitted on every position of the first `tokens` tokens of `cache` (prompts and answers)."""
    data, layers = _cached(cache)

    def chunks() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = 0
        for i in range(len(data)):
            if n >= tokens:
                return
            item = data[i]
            n += len(item["input_ids"])
            yield _features(item, layers), item["input_ids"].long()

    return fit_token_map(chunks(), emb, ridge), layers


def run(
    target_dir: str, fit_cache: Path, cache: Path, samples: int, fit_tokens: int, head_dim: int
) -> list[str]:
    """The table of `--cache`'s first `samples` samples: top-1 of each copy mechanism at its answer positions."""
    from draftsmith.models.draft_layer import rope_parameters
    from draftsmith.models.target import FrozenTarget, TargetConfig

    target = FrozenTarget.load(TargetConfig(path=target_dir), layers=0)
    emb = target.embed_tokens.weight.detach().float()
    theta = float(rope_parameters(target.model.config)["rope_theta"])
    token_map, fit_layers = fit_from_cache(fit_cache, emb, fit_tokens, ridge=1e-3)
    data, layers = _cached(cache)
    if layers != fit_layers:
        raise ValueError(f"the two caches read different target layers: {fit_layers} and {layers}")
    generator = torch.Generator().manual_seed(0)
    proj = torch.randn(emb.shape[1], head_dim, generator=generator)
    basis = torch.linalg.qr(torch.randn(emb.shape[1], head_dim, generator=generator))[0]
    head = target.lm_head.weight.detach().float()
    space = KeySpace(emb, head, token_map, proj, basis, theta)
    totals: dict[str, list[int]] = {}
    for i in range(min(samples, len(data))):
        item = data[i]
        item["top1"] = item[feature_key(TOP1)]
        for name, (hits, counts) in measure_sample(item, _features(item, layers), space).items():
            totals.setdefault(name, [0, 0])
            totals[name][0] += hits
            totals[name][1] += counts
    rows = [[name, counts, fmt_value(hits / max(counts, 1))] for name, (hits, counts) in totals.items()]
    return table(["mechanism (keys / positions)", "answer positions", "top-1 against the target"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_ceiling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument(
        "--fit-cache", type=Path, required=True, help="a cache of the recipe's taps to fit the key map"
    )
    parser.add_argument("--cache", type=Path, required=True, help="a draft.labels=top1 cache of copy chats")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--fit-tokens", type=int, default=131072)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args(argv)
    print(
        "\n".join(run(args.target, args.fit_cache, args.cache, args.samples, args.fit_tokens, args.head_dim))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
