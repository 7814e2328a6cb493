"""Medusa-2's adapted target: serve it, and measure how far it moved from the original (ALGORITHMS.md 2.2).

Medusa-2 trains a LoRA adapter on the target, so the model that is served is no longer the original: the
evaluator decodes with the adapter merged (`models/medusa2.py: adapted_target`) and reports `adapter_drift`: the mean
KL(p_original || p_adapted) per token over the original's own greedy answers to the evaluation prompts,
and on how many prompts the greedy answer changed. Medusa-2 is only worth deploying when both are small.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.models.divergences import divergence
from draftsmith.models.target import FrozenTarget

from .decoder import plain_decode
from .sampling import Sampling


@torch.no_grad()
def adapter_drift(
    original: FrozenTarget, adapted: FrozenTarget, prompts: list[list[int]], max_new_tokens: int
) -> dict[str, Any]:
    """Mean KL(p_original || p_adapted) over the original's greedy answers, and how many answers changed."""
    total_kl, tokens, changed = 0.0, 0, 0
    for prompt in prompts:
        ref = plain_decode(original, prompt, max_new_tokens, Sampling()).tokens
        changed += plain_decode(adapted, prompt, max_new_tokens, Sampling()).tokens != ref
        ids = torch.tensor([prompt + ref[:-1]], device=original.device)
        p = original.model(input_ids=ids).logits[0, len(prompt) - 1 :]
        q = adapted.model(input_ids=ids).logits[0, len(prompt) - 1 :]
        kl, _ = divergence(p, q, "fkl")
        total_kl += float(kl.sum())
        tokens += kl.numel()
    return {
        "mean_kl": total_kl / max(tokens, 1),
        "greedy_changed": changed,
        "prompts": len(prompts),
        "tokens": tokens,
    }
