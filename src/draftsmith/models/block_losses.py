"""The losses of block drafters (DFlash, docs/ALGORITHMS-BLOCK.md 1.2): per-slot sums over sampled blocks.

Pure functions: tensors in, `(sums [K], counts [K], metrics {name: [K]})` out in fp32, one term per predicted
slot k = 1..K (K = B-1), so the loop reports and weights each depth like the head families' `depth{k}` terms.
"""

from __future__ import annotations

import zlib

import torch

from .chunking import ChunkResult, recomputing
from .objectives import dpace_weights, token_objective


def row_seeds(input_ids: torch.Tensor, base: int) -> list[int]:
    """One generator seed per row from `base` and the row's tokens: a sample draws the same blocks whichever
    micro-batch, rank or accumulation step it lands in."""
    rows = input_ids.detach().to("cpu", torch.int64).numpy()
    return [(base * 1_000_003 + zlib.crc32(row.tobytes())) % 2**63 for row in rows]


def sample_anchors(
    loss_mask: torch.Tensor, count: int, seeds: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block anchors: `(anchors [R, N] long ascending, keep [R, N] bool)`.

    A candidate anchor a (0 <= a <= S-2) has a trained next token (`loss_mask[a+1]`), so the block that starts
    an answer (anchored at the last prompt token) is trained too. Row r draws min(count, its candidates)
    without replacement with a generator seeded by `seeds[r]`; N is the largest draw of any row, and shorter
    rows are padded with blocks that have `keep` False (anchor 0, no loss weight).
    """
    R, S = loss_mask.shape
    cand = torch.zeros(R, S, dtype=torch.bool)
    cand[:, :-1] = loss_mask[:, 1:].bool().cpu()
    picks = []
    for r in range(R):
        keys = torch.rand(S, generator=torch.Generator().manual_seed(seeds[r]))
        order = torch.where(cand[r], keys, torch.full_like(keys, 2.0)).argsort()
        picks.append(order[: min(count, int(cand[r].sum()))].sort().values)
    n = max(1, max(len(p) for p in picks))
    anchors = torch.zeros(R, n, dtype=torch.long)
    keep = torch.zeros(R, n, dtype=torch.bool)
    for r, p in enumerate(picks):
        anchors[r, : len(p)], keep[r, : len(p)] = p, True
    return anchors.to(loss_mask.device), keep.to(loss_mask.device)


def block_targets(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What slots 1..B-1 of every block learn: `(labels [R, N, B-1], valid [R, N, B-1] bool,
    positions [R, N, B-1])`.

    Slot k of the block anchored at a predicts the data token x_{a+k} (slot 0 holds the anchor and is never
    trained); it counts when the block is kept, a+k < S and x_{a+k} is a trained token. `positions` = a+k-1:
    the column whose target distribution is the one over x_{a+k} (clamped into the sequence where invalid).
    """
    S = input_ids.shape[1]
    pos = anchors[..., None] + torch.arange(1, block, device=anchors.device)  # [R, N, B-1]
    inside = pos < S
    col = pos.clamp(max=S - 1)
    rows = torch.arange(input_ids.shape[0], device=anchors.device)[:, None, None]
    labels = input_ids[rows, col]
    valid = keep[..., None] & inside & loss_mask.bool()[rows, col]
    return labels, valid, col - 1


def block_slot_loss(
    draft_logits: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    target_logits: torch.Tensor,
    kind: str = "ce",
    *,
    kappa: float = 3.0,
    dpace_alpha: float | None = None,
) -> ChunkResult:
    """Per-slot loss sums over blocks `[R, c]` of K predicted slots.

    Args:
        draft_logits: `[R, c, K, V]`.
        labels: `[R, c, K]` the data tokens (the `ce` label, and D-PACE's confidence label).
        valid: `[R, c, K]` bool, the slots that count.
        target_logits: `[R, c, K, V]` the target's logits for the same tokens (p of every other objective; the
            greedy token the metrics compare with).
        kind: an objective of models/objectives.py: ce (the data token; z-lab, SpecForge), kl, tv, lk_alpha,
            lk_lambda (against the target's distribution; docs/ALGORITHMS-BLOCK.md section 3).
        kappa: lk_lambda's lam = exp(-kappa alpha).
        dpace_alpha: weight the slots of each block by D-PACE with this confidence floor (confidence =
            exp(-CE on the data token), computed without gradient); None = every valid slot weighs 1.

    Returns:
        `(sums [K], counts [K], {"top1": [K], "prefix": [K], "alpha": [K]})`: top1 counts slots whose argmax
        equals the target's greedy token, prefix counts slots whose block is right at every slot up to it (what
        a chain accepts at T=0, teacher-forced), alpha sums sum_v min(p, q) (acceptance at T=1). Metrics are 0
        while `recomputing()`.
    """
    K, V = draft_logits.shape[-2:]
    per, alpha = token_objective(
        kind, draft_logits.reshape(-1, V), target_logits.reshape(-1, V), labels.reshape(-1), kappa=kappa
    )
    per, alpha = per.view(labels.shape), alpha.view(labels.shape)
    w = valid.float()
    if dpace_alpha is not None:
        with torch.no_grad():
            ce = (
                per
                if kind == "ce"
                else -draft_logits.float().log_softmax(-1).gather(-1, labels[..., None])[..., 0]
            )
            w = dpace_weights(ce, valid, dpace_alpha)
    sums = (per * w).reshape(-1, K).sum(0)
    counts = valid.float().reshape(-1, K).sum(0)
    zero = torch.zeros_like(sums)
    metrics = {"top1": zero, "prefix": zero, "alpha": zero}
    if not recomputing():
        with torch.no_grad():
            hit = (draft_logits.argmax(-1) == target_logits.argmax(-1)) & valid
            run = torch.cumprod(hit.float(), dim=-1) * valid.float()
            metrics = {
                "top1": hit.float().reshape(-1, K).sum(0),
                "prefix": run.reshape(-1, K).sum(0),
                "alpha": (alpha * valid.float()).reshape(-1, K).sum(0),
            }
    return sums, counts, metrics
