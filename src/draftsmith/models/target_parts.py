"""The target's own parts that drafters reuse, frozen: its logits exactly as its forward computes them
(`TargetHead`) and its embedding table without any scale (`PlainEmbedding`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def foldable_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook for an LM head: its input with standard strides when its leading dims are not.

    `torch.matmul` of a `[B, T, H]` input and a 2-D weight folds into one matrix product only when the leading
    dims have the strides of a dense tensor, and it checks them even where a dim has size 1. The last
    position of a batch (`hidden[:, -1:]`, what `generate`'s prefill hands the head with `logits_to_keep=1`)
    fails that check, and matmul then expands the weight to `[B, H, V]` and copies it: at a batch of 64,
    SmolLM2's 49,152 x 576 head in bfloat16 took 6.4 s instead of 9 ms (docs/BENCHMARKS.md, "The head's copy in
    generate's prefill").
    A copy of the few input rows costs microseconds; the values are the same products.
    """
    if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 3:
        return None
    x = args[0]
    sizes, strides = x.shape, x.stride()
    if all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(x.dim() - 2)):
        return None
    return (x.clone(memory_format=torch.contiguous_format), *args[1:])


class TargetHead(nn.Module):
    """The target's logits from its post-norm state, exactly as the model's own forward computes them:
    the LM head, then Granite's `logits / logits_scaling`, Cohere's `logits * logit_scale` and Gemma-2/3's
    `tanh(logits / c) * c` final soft-capping where the config sets them. `FrozenTarget.check_exact`
    proves the result equals `model(...).logits` for every target it loads.

    Not a submodule of any drafter (drafters keep it in `FrozenParts`), so it is never trained nor saved.
    """

    def __init__(self, lm_head: nn.Module, text_config: Any):
        super().__init__()
        self.lm_head = lm_head
        self.divide = float(getattr(text_config, "logits_scaling", None) or 1.0)
        self.multiply = float(getattr(text_config, "logit_scale", None) or 1.0)
        self.softcap = getattr(text_config, "final_logit_softcapping", None)

    @property
    def weight(self) -> torch.Tensor:
        weight: Any = self.lm_head.weight
        return weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.divide != 1.0:
            logits = logits / self.divide
        if self.multiply != 1.0:
            logits = logits * self.multiply
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class PlainEmbedding(nn.Module):
    """The target's embedding table looked up without any scale. Gemma multiplies embeddings by sqrt(H)
    (inside the module for Gemma-3, in the decoder for Gemma-2) and Granite by `embedding_multiplier`; the
    engines' Llama-style drafts embed with the plain table, so drafters train on exactly what they are
    served with (ModelOpt's Gemma report: a scale present in training and absent in serving gave tau 1.004).
    """

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.table = embedding

    @property
    def weight(self) -> torch.Tensor:
        weight: Any = self.table.weight
        return weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if getattr(self.table, "embed_scale", None) is None:
            return self.table(ids)  # through the module: ZeRO-3 gathers its sharded weight in its hooks
        return torch.nn.functional.embedding(ids, self.weight)  # Gemma-3: the table without its scale
