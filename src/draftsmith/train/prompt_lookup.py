"""Where prompt lookup would draft the label: the copy weighting of EAGLE-3's loss (`draft.copy_weight`).

Prompt lookup (the evaluator's `ngram` drafter) drafts the token that followed the latest earlier occurrence
of the context's last 3-, 2- or 1-gram. On text that repeats itself (a rewritten answer, code restating its
prompt, a model's own loops) it accepts far more than a small drafter: the chat drafter of docs/BENCHMARKS.md
accepts 0.58 tokens a step where prompt lookup's whole five-token draft is right, as on any other step. The
copy weight multiplies the loss of the positions whose label prompt lookup would have drafted, to make the
drafter's attention learn to find and copy the earlier occurrence, as the target does. Measured on the chat
answers it did not (docs/BENCHMARKS.md, "Teaching the chat drafter to copy"): it is off by default.

The copy attention (`draft.copy_attention`) supervises the copy itself instead of the token: in EAGLE-3's
layout column j of the draft layer holds the features of x_j and the embedding of x_{j+1}, column t's input
token is x_{t+1} and its first step predicts x_{t+2}, so the earlier columns worth reading at t are those j <= t
with x_j = x_{t+1} and x_{j+1} = x_{t+2} (`copy_columns`). The loss is -log of the attention the first
key/value group puts on them (`copy_attention_terms`), at the answer positions that have any.
"""

from __future__ import annotations

import torch

from draftsmith.models.parts import shift_left

MAX_NGRAM = 3  # the evaluator's ngram drafter's default (--ngram-max)
COPY_TERM = "copy_attention"  # the loss term of `draft.copy_attention`, after EAGLE-3's depth terms


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


def copy_columns(ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B, T, T]` bool: at column t (input token x_{t+1}, first-step label x_{t+2}) the earlier columns j <= t
    whose token x_j is x_{t+1} and whose next token x_{j+1} is x_{t+2}: reading column j's embedding half
    (x_{j+1}) gives column t its label. Only where x_{t+2} is a real token."""
    nxt = shift_left(ids)
    label_real = shift_left(shift_left(attention_mask.bool()))
    T = ids.shape[1]
    earlier = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    same_now = ids[:, None, :] == nxt[:, :, None]  # [B, t, j]: x_j == x_{t+1}
    same_next = nxt[:, None, :] == shift_left(nxt)[:, :, None]  # x_{j+1} == x_{t+2}
    return same_now & same_next & earlier & label_real[:, :, None]


def copy_attention_terms(
    scores: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The copy-attention loss summed over `rows` `[B, T]` (columns that train and have a copy source), and the
    rows where the group's mean attention peaks on a copy source (its top-1, summed).

    Args:
        scores: a key/value group's attention scores `[B, G, T, T]`, before the mask.
        columns: `copy_columns`' sources `[B, T, T]`.
        rows: the columns the loss counts `[B, T]`.
        keys: the columns attention may read `[B, T]` (real tokens; each column also reads only j <= t).
    """
    scores = scores.float()
    T = scores.shape[-1]
    visible = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril() & keys[:, None, :]
    floor = torch.finfo(scores.dtype).min
    every = scores.masked_fill(~visible[:, None], floor).logsumexp(-1)
    on_source = scores.masked_fill(~columns[:, None], floor).logsumexp(-1)
    nll = torch.where(rows, (every - on_source).mean(1), 0.0)
    peak = (scores.masked_fill(~visible[:, None], floor).softmax(-1).mean(1)).argmax(-1, keepdim=True)
    hits = columns.gather(-1, peak)[..., 0] & rows
    return nll.sum(), hits.sum().float()


def copy_rows(batch: dict[str, torch.Tensor], first_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`draft.copy_attention`'s copy sources `[B, T, T]` (`copy_columns`) and the columns its loss counts
    `[B, T]`: those the first draft step trains (`first_mask`) that have a source."""
    columns = copy_columns(batch["input_ids"], batch["attention_mask"])
    return columns, columns.any(-1) & first_mask


def with_copy_term(
    scores: torch.Tensor,
    batch: dict[str, torch.Tensor],
    first_mask: torch.Tensor,
    sums: torch.Tensor,
    metrics: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EAGLE-3's per-term loss sums `[S]` and metrics with the copy-attention term appended: its loss sum, and as
    its `top1` the columns where the head's attention peaks on a copy source (its other metrics 0)."""
    columns, rows = copy_rows(batch, first_mask)
    loss, hits = copy_attention_terms(scores, columns, rows, batch["attention_mask"].bool())
    merged = {}
    for name, value in metrics.items():
        extra = hits if name == "top1" else torch.zeros((), device=value.device)
        merged[name] = torch.cat([value, extra.to(value.dtype)[None]])
    return torch.cat([sums, loss.to(sums.dtype)[None]]), merged
