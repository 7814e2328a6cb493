"""Token lists as tensors: what the local answer generator and the trainers' batching share."""

from __future__ import annotations

import torch


def left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists for batched generation: `(input_ids [B, T], attention_mask [B, T])`, so that
    every row's next token is generated at the same column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    return ids.to(device), mask.to(device)
