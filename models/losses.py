"""Drafter losses: pure functions returning per-term sums and token counts, computed in fp32.

They know nothing of ranks or gradient accumulation: the training loop divides each term's sum by the
term's token count over the whole accumulation window on all ranks, then applies the term weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def medusa_token_counts(loss_mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Loss tokens per head, known before the forward pass.

    Head k (1-based) at column t predicts x_{t+k+1}, so its targets are columns k+1..T-1 and a position
    counts when its *target* token is trained (an assistant token).

    Args:
        loss_mask: `[B, T]` bool, True on trained tokens.
        num_heads: K.

    Returns:
        `[K]` float32 counts.
    """
    T = loss_mask.shape[1]
    return torch.stack(
        [
            loss_mask[:, k + 1 :].sum() if k + 1 < T else loss_mask.new_zeros(()).sum()
            for k in range(1, num_heads + 1)
        ]
    ).float()


def medusa_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Medusa-1 cross-entropy per head (ALGORITHMS.md 2.2), as sums.

    Args:
        logits: `[K, B, T, V]`; head k (1-based, index k-1) at column t predicts x_{t+k+1}.
        input_ids: `[B, T]` the token ids (targets are the ids themselves, shifted by k+1).
        loss_mask: `[B, T]` bool, True on trained (assistant) tokens; indexes the target token.

    Returns:
        `(loss_sums [K], n_tokens [K], metrics)` where metrics holds `top1` and `top5` `[K]`: sums of
        correct predictions over the same positions (divide by `n_tokens` for accuracies).
    """
    K, _, T, _ = logits.shape
    sums, counts, top1, top5 = [], [], [], []
    for i in range(K):
        shift = i + 2  # head i (0-based) predicts x_{t+i+2}
        if shift >= T:
            zero = logits.new_zeros((), dtype=torch.float32)
            sums.append(zero + 0.0 * logits[i].sum())  # keep every head in the graph for DDP
            counts.append(zero)
            top1.append(zero)
            top5.append(zero)
            continue
        lg = logits[i, :, : T - shift].float()  # [B, T-shift, V]
        tgt = input_ids[:, shift:]  # [B, T-shift]
        m = loss_mask[:, shift:]
        ce = F.cross_entropy(lg.transpose(1, 2), tgt, reduction="none")  # [B, T-shift]
        sums.append((ce * m).sum())
        counts.append(m.sum().float())
        with torch.no_grad():
            topk = lg.topk(min(5, lg.shape[-1]), dim=-1).indices  # [B, T-shift, 5]
            hit = topk == tgt.unsqueeze(-1)
            top1.append((hit[..., 0] & m).sum().float())
            top5.append((hit.any(-1) & m).sum().float())
    return torch.stack(sums), torch.stack(counts), {"top1": torch.stack(top1), "top5": torch.stack(top5)}
