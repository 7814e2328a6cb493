"""Independent draft language models that share the target's tokenizer.

`draft_from_target` builds the classic "copied layers" draft: the target's own architecture cut to its
first `num_layers` decoder layers, with the target's embeddings, final norm and LM head copied in. It is
what transformers' assisted generation is usually demonstrated with, and the starting point that
distillation (train/distill.py) improves on.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


@torch.no_grad()
def draft_from_target(model: Any, num_layers: int) -> Any:
    """A new causal LM: `model`'s config with `num_layers` layers, weights copied from `model`'s first layers.

    Args:
        model: a transformers causal LM laid out like Llama (`model.layers.{i}`, `model.norm`, `lm_head`).
        num_layers: how many of its first decoder layers to keep (1 .. its layer count).
    """
    config = copy.deepcopy(model.config)
    total = int(config.num_hidden_layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total} (the target's layer count), got {num_layers}")
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    draft = type(model)(config).to(dtype=model.dtype, device=model.device)
    missing, unexpected = draft.load_state_dict(model.state_dict(), strict=False)
    if missing:
        raise ValueError(
            f"cannot copy {type(model).__name__} into a {num_layers}-layer draft: missing {missing[:3]}"
        )
    # Only the dropped layers' tensors may be left over.
    dropped = [k for k in unexpected if not any(f".layers.{i}." in k for i in range(num_layers, total))]
    if dropped:
        raise ValueError(f"unexpected tensors when copying the target into a draft: {dropped[:3]}")
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()
