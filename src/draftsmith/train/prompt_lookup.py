"""Where prompt lookup would draft the label: the copy weighting of EAGLE-3's loss (`draft.copy_weight`).

Prompt lookup (the evaluator's `ngram` drafter) drafts the token that followed the latest earlier occurrence
of the context's last 3-, 2- or 1-gram. On text that repeats itself (a rewritten answer, code restating its
prompt, a model's own loops) it accepts far more than a small drafter: the chat drafter of docs/BENCHMARKS.md
accepts 0.58 tokens a step where prompt lookup's whole five-token draft is right, as on any other step. The
copy weight multiplies the loss of the positions whose label prompt lookup would have drafted, to make the
drafter's attention learn to find and copy the earlier occurrence, as the target does. Measured on the chat
answers it did not (docs/BENCHMARKS.md, "Teaching the chat drafter to copy"): it is off by default.
"""

from __future__ import annotations

import torch

MAX_NGRAM = 3  # the evaluator's ngram drafter's default (--ngram-max)


def lookup_next(ids: torch.Tensor, lengths: torch.Tensor, max_ngram: int = MAX_NGRAM) -> torch.Tensor:
    """`[B, T]`: at position e the token prompt lookup drafts after the prefix `ids[b, :e+1]` (the token after the
    latest earlier occurrence of its last n-gram, the longest n from `max_ngram` down to 1 that occurs), -1 where
    no n-gram occurs earlier or e is past the sequence's `lengths[b]` real tokens.

    One pass per sequence with a dict of each n-gram's latest end: O(T n), where the evaluator's drafter scans
    the whole context for every position (its `continuations` is this function's test oracle)."""
    out = torch.full(ids.shape, -1, dtype=torch.long)
    for b, (row, n_real) in enumerate(zip(ids.tolist(), lengths.tolist(), strict=True)):
        latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        for e in range(n_real):
            found = -1
            for n in range(max_ngram, 0, -1):
                if e + 1 < n:
                    continue
                key = tuple(row[e - n + 1 : e + 1])
                if found < 0 and key in latest[n]:
                    found = row[latest[n][key] + 1]
                latest[n][key] = e
            out[b, e] = found
    return out.to(ids.device)


def copy_weights(
    ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, weight: float
) -> torch.Tensor:
    """`[B, T, S]` loss weights of EAGLE-3's S TTT steps: 1 + `weight` where prompt lookup would draft the step's
    label, 1 elsewhere. Step s's label at column t (`labels[b, t, s]`) is the token after position t+s+1, so it
    is compared with `lookup_next` at t+s+1."""
    proposals = lookup_next(ids, attention_mask.sum(dim=1))
    steps = labels.shape[-1]
    ahead = torch.nn.functional.pad(proposals, (0, steps + 1), value=-1)
    drafted = torch.stack([ahead[:, s + 1 : s + 1 + ids.shape[1]] for s in range(steps)], dim=-1)
    copied = (drafted == labels) & (drafted >= 0)  # no draft is never a copy, even of a missing (-1) label
    return 1.0 + weight * copied.float()
