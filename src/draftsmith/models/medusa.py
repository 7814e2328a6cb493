"""Medusa-1 heads (Cai et al. 2024; FasterDecoding/Medusa), per ALGORITHMS.md section 2.

K heads read the frozen target's post-norm last hidden state h_t (canonical id "final"); head k
(1-based) predicts token x_{t+k+1}. Each head is `ResBlock x n_layers -> Linear(H, V, bias=False)`, where
ResBlock(x) = x + SiLU(W x + b) with W zero-initialised (the block starts as the identity; b keeps
PyTorch's default init) and the Linear initialised by copying the target's lm_head, as in Medusa v0.1
and the axolotl Medusa-2 recipe. The heads do not see previously drafted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class MedusaConfig:
    """Medusa head hyper-parameters (saved in the checkpoint's config.json)."""

    num_heads: int = field(default=5, metadata={"help": "Number of heads K; head k predicts token t+k+1."})
    num_layers: int = field(default=1, metadata={"help": "ResBlocks per head (released Medusa heads use 1)."})
    loss_decay: float = field(
        default=0.8, metadata={"help": "Loss weight of head k is loss_decay**k (Medusa-1 paper, k = 1..K)."}
    )
    head_weights: list[float] | None = field(
        default=None, metadata={"help": "Explicit per-head loss weights (K values); overrides loss_decay."}
    )
    init_from_lm_head: bool = field(
        default=True,
        metadata={"help": "Initialise each head's Linear(H, V) as a copy of the target lm_head."},
    )

    def __post_init__(self) -> None:
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")
        if self.num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {self.num_layers}")
        if self.head_weights is not None and len(self.head_weights) != self.num_heads:
            raise ValueError(f"head_weights has {len(self.head_weights)} values for {self.num_heads} heads")

    def loss_weights(self) -> torch.Tensor:
        """Per-head loss weights `[K]`: explicit `head_weights`, else `loss_decay ** k` for k = 1..K."""
        if self.head_weights is not None:
            return torch.tensor(self.head_weights, dtype=torch.float32)
        return torch.tensor([self.loss_decay**k for k in range(1, self.num_heads + 1)], dtype=torch.float32)


class ResBlock(nn.Module):
    """y = x + SiLU(W x + b), W zero-initialised so the block starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads over the target's `final` features.

    Args:
        config: head hyper-parameters.
        hidden_size: the target's hidden size H.
        vocab_size: the target's vocabulary size V.
    """

    kind = "medusa"  # its record in models/families.py

    feature_layers = ("final",)

    def __init__(self, config: MedusaConfig, hidden_size: int, vocab_size: int):
        super().__init__()
        self.config = config
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        # One fresh module per block and per head. The reference code's `[ResBlock(h)] * n` repeats one
        # module object, so its "layers" share weights; a comprehension builds independent ones.
        self.heads = nn.ModuleList(
            [
                nn.Sequential(
                    *[ResBlock(hidden_size) for _ in range(config.num_layers)],
                    nn.Linear(hidden_size, vocab_size, bias=False),
                )
                for _ in range(config.num_heads)
            ]
        )

    @torch.no_grad()
    def init_from_lm_head(self, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's LM head `[V, H]` into every head's final Linear (a copy, not a shared tensor)."""
        if tuple(lm_head_weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"lm_head weight has shape {tuple(lm_head_weight.shape)}, "
                f"expected ({self.vocab_size}, {self.hidden_size})"
            )
        for head in self.heads:
            head[-1].weight.copy_(lm_head_weight)  # type: ignore[index]

    def forward(self, hidden: torch.Tensor, project: bool = True) -> torch.Tensor:
        """`hidden [B, T, H]` -> logits `[K, B, T, V]`, or with `project=False` every head's trunk output
        `[K, B, T, H]` (training applies the vocabulary projections one sequence chunk at a time)."""
        hidden = self._own(hidden)  # once, not once per head
        if not project:
            return torch.stack([self.trunk(hidden, k) for k in range(len(self.heads))])
        return torch.stack([head(hidden) for head in self.heads])

    def _own(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` in the heads' dtype: a bfloat16 target or cache feeds float32 heads trained without autocast."""
        head: Any = self.heads[0]
        return hidden.to(head[-1].weight.dtype)

    def head_logits(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Logits of head `k` (0-based) only: `[..., H] -> [..., V]`."""
        return self.heads[k](self._own(hidden))

    def trunk(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Head `k`'s (0-based) ResBlocks: `[..., H] -> [..., H]`, what its vocabulary projection reads."""
        head: Any = self.heads[k]  # an nn.Sequential: ResBlocks then the Linear
        return head[:-1](self._own(hidden))

    def project(self, trunk: torch.Tensor, k: int) -> torch.Tensor:
        """Head `k`'s (0-based) vocabulary projection of its `trunk` output: `[..., H] -> [..., V]`."""
        head: Any = self.heads[k]
        return head[-1](trunk)
