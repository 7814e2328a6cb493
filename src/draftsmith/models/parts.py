"""What several drafter families share: the left shift that aligns "the next token" with a column, the causal
mask, the keyword a transformers module takes its KV cache by, and the base of a drafter that borrows the
target's frozen embedding and LM head (EAGLE-1, EAGLE-3, MTP).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def shift_left(x: torch.Tensor) -> torch.Tensor:
    """x[:, t] <- x[:, t+1], last column zero (the reference code's shift)."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


def causal_mask(length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Causal mask `[1, 1, T, T]` bool, True = attend (column t sees columns <= t), for SDPA."""
    cols = torch.arange(length, device=device)
    return (cols[None, :] <= cols[:, None])[None, None]


def with_cache(module: nn.Module, cache: Any) -> dict[str, Any]:
    """`{keyword: cache}` for a call of `module`: transformers 5.24 renamed the KV-cache argument of models,
    decoder layers and attention from `past_key_values` to `cache` (the old name warns, and goes in 5.40);
    earlier releases, and models not yet moved, take `past_key_values`."""
    return {_cache_keyword(type(module).forward): cache}


@functools.cache
def _cache_keyword(forward: Callable[..., Any]) -> str:
    parameters = inspect.signature(forward).parameters  # follows the deprecation wrapper
    return "cache" if "cache" in parameters else "past_key_values"


class FrozenParts:
    """The target's embedding and LM head as the drafter uses them: frozen, shared, not saved, and not
    registered as submodules (so the drafter's state dict and optimizer never see them)."""

    def __init__(self, embed_tokens: nn.Module, lm_head: nn.Module):
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head


class DrafterOnTarget(nn.Module):
    """A drafter built from the target's config that borrows its frozen embedding and LM head (EAGLE, MTP):
    constructed as `cls(config, target_config, vocab_size)`, with the target config saved in its checkpoint."""

    target_config: Any  # the target's transformers config
    frozen: FrozenParts | None

    def attach_target(self, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        """Use the target's (frozen) embedding and LM head."""
        self.frozen = FrozenParts(embed_tokens, lm_head)

    def _parts(self) -> FrozenParts:
        if self.frozen is None:
            raise RuntimeError("attach_target(embed_tokens, lm_head) must be called before the forward")
        return self.frozen

    def target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The frozen target LM head on the drafter's `hidden [.., H]`, read in the head's dtype: a float32
        drafter trained without autocast feeds a bfloat16 target's head."""
        head = self._parts().lm_head
        weight = getattr(head, "weight", None)
        return head(hidden if weight is None else hidden.to(weight.dtype))

    def extra_checkpoint_config(self) -> dict[str, Any]:
        return {"target_config": self.target_config.to_dict()}

    @classmethod
    def from_checkpoint_config(cls, drafter_config: Any, saved: dict[str, Any]) -> DrafterOnTarget:
        from transformers import AutoConfig

        raw = dict(saved["target_config"])
        target_config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        return cls(drafter_config, target_config, int(saved["draft_vocab_size"]))
