"""Medusa-2: Medusa heads trained jointly with a LoRA adapter on the target (ALGORITHMS.md section 2.2).

The backbone is the target with a peft LoRA adapter; the heads read its post-norm last hidden state. The
base loss is self-distillation, KL(p_original || p_adapted) with p_original the same network with the
adapter disabled (what keeps the served distribution close to the original); the heads add
lambda_0 * 0.8^k cross-entropy each. Heads learn at a larger rate, and a heads-only warm-up comes first.

The checkpoint is the heads (a Medusa drafter checkpoint) plus `adapter/` (peft's own format); the evaluator
serves the target with the adapter merged and reports how far it moved from the original.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .medusa import MedusaHeads
from .target import FrozenTarget, find_decoder
from .target_parts import TargetHead

ADAPTER_DIR = "adapter"


@dataclass
class Medusa2Config:
    """The `medusa2:` section of recipes/medusa/*.yaml (off: Medusa-1 heads on the frozen target)."""

    enabled: bool = field(
        default=False, metadata={"help": "Train a LoRA adapter on the target with the heads."}
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (scale alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "Target modules that get an adapter (peft `target_modules`)."},
    )
    heads_coefficient: float = field(
        default=0.2, metadata={"help": "lambda_0: head k's loss weight is lambda_0 * loss_decay**k."}
    )
    heads_lr_scale: float = field(default=4.0, metadata={"help": "Heads learn at train.lr times this."})
    warmup_steps: int = field(default=0, metadata={"help": "Heads-only steps before the adapter trains."})

    def __post_init__(self) -> None:
        if (
            self.lora_r < 1
            or self.heads_coefficient <= 0
            or self.heads_lr_scale <= 0
            or self.warmup_steps < 0
        ):
            raise ValueError(
                "medusa2 needs lora_r >= 1, heads_coefficient > 0, heads_lr_scale > 0 and warmup_steps >= 0"
            )


class Medusa2Model(nn.Module):
    """The adapted backbone and the heads, trained together.

    Args:
        target_model: the target's transformers causal LM; the adapter is injected into it (peft).
        heads: the Medusa heads.
        config: the adapter settings.
    """

    def __init__(self, target_model: Any, heads: MedusaHeads, config: Medusa2Config):
        super().__init__()
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_target_modules),
            bias="none",
        )
        self.backbone = get_peft_model(target_model, lora)
        self.heads = heads

    def _logits_and_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[Any, Any]:
        base: Any = self.backbone.get_base_model()
        hidden = find_decoder(base)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return TargetHead(base.get_output_embeddings(), base.config.get_text_config())(hidden), hidden

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(adapted logits [B, T, V], head logits [K, B, T, V], original logits [B, T, V] (no gradient))`."""
        with torch.no_grad(), self.backbone.disable_adapter():
            original, _ = self._logits_and_hidden(input_ids, attention_mask)
        adapted, hidden = self._logits_and_hidden(input_ids, attention_mask)
        return adapted, self.heads(hidden), original

    def adapter_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.backbone.named_parameters() if p.requires_grad and "lora_" in n]


def adapter_dir(drafter_spec: str) -> Path | None:
    """The Medusa-2 adapter of a drafter checkpoint directory, if it has one."""
    path = Path(drafter_spec).expanduser() / ADAPTER_DIR
    return path if (path / "adapter_config.json").is_file() else None


def merged_adapter(target: FrozenTarget, checkpoint: Path) -> FrozenTarget | None:
    """The Medusa family's `served_target` (models/families.py): `target` with the checkpoint's adapter merged,
    for a Medusa-2 checkpoint; None for Medusa-1 heads, which leave the target as it is."""
    adapter = adapter_dir(str(checkpoint))
    return adapted_target(target, adapter) if adapter is not None else None


def adapted_target(target: FrozenTarget, adapter: Path) -> FrozenTarget:
    """A copy of `target` with the peft adapter at `adapter` merged into its weights."""
    from peft import PeftModel

    merged: Any = PeftModel.from_pretrained(copy.deepcopy(target.model), str(adapter)).merge_and_unload()
    return FrozenTarget(
        merged.eval(), target.tokenizer, f"{target.name_or_path} + {adapter}", target.revision
    )
