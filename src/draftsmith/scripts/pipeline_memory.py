"""How much of a GPU the pipeline's answers and training take: the answers' batch from their KV caches, the
training micro batch from EAGLE-3's activations. On a CPU both keep the measured CPU settings (memory is not
what limits a CPU: a wider batch only waits longer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from draftsmith.config.loader import load_config
from draftsmith.models.draft_layer import draft_layer_settings
from draftsmith.scripts.pipeline_plan import REGENERATE_BATCH
from draftsmith.train.eagle import EagleRecipe

# The answers: the prompt length the KV caches leave room for, the share of free memory they may fill (the
# rest: the weights' activations, logits and the allocator's slack), the widest batch, and the batch where no
# config can be read before loading.
PROMPT_ROOM = 768
GPU_CACHE_SHARE = 0.6
GPU_BATCH_CAP = 1024
GPU_BATCH_FALLBACK = 256
# Training: the share of the GPU's memory EAGLE-3's activations may fill (the rest: the target's weights and
# its forward for online features, the draft logits of one loss chunk, optimizer state and slack), and the
# widest micro batch (past it a step is no longer launch-bound, and the steps of an epoch get few).
GPU_TRAIN_SHARE = 0.5
GPU_TRAIN_CAP = 64
STEPS_PER_EPOCH_FLOOR = 16  # a micro batch never takes more than 1/16 of the answers


def _text_config(target: Path) -> Any | None:
    """The target's text config, or None for a .gguf file (no config to read before it is loaded)."""
    try:
        return AutoConfig.from_pretrained(str(target)).get_text_config()
    except (OSError, ValueError):
        return None


def _kv_width(config: Any) -> int:
    """Key (or value) elements per token per layer of the target's KV cache: kv heads x head dim."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int((getattr(config, "num_key_value_heads", None) or heads) * head_dim)


def answer_batch_size(target: Path, answer_tokens: int, dtype: str) -> int:
    """Answers generated together: REGENERATE_BATCH on a CPU; on a GPU as many as the KV caches of prompts of
    PROMPT_ROOM tokens and their answers fit in GPU_CACHE_SHARE of the free memory (at most GPU_BATCH_CAP: a
    wider batch waits longer on its longest answer)."""
    if not torch.cuda.is_available():
        return REGENERATE_BATCH
    config = _text_config(target)
    if config is None:
        return GPU_BATCH_FALLBACK
    per_token = 2 * config.num_hidden_layers * _kv_width(config) * (4 if dtype == "float32" else 2)
    free, _ = torch.cuda.mem_get_info()
    fits = int(free * GPU_CACHE_SHARE // (per_token * (PROMPT_ROOM + answer_tokens)))
    return max(1, min(GPU_BATCH_CAP, fits))


def eagle3_activation_bytes(config: Any, ttt_steps: int) -> int:
    """The bytes one token's EAGLE-3 training forward keeps for the backward pass, over all TTT steps, as
    float32 (an upper bound under bfloat16 autocast, which keeps the norms in float32 anyway).

    Per step, the one draft layer (hidden H, MLP width I: `draft_layer_settings`, the target's) keeps about 18 H + 4 I elements, and
    its attention every earlier step's keys and values (2 (S+1) kv-width elements): measured with autograd's
    saved-tensor hooks on SmolLM2's shape and two smaller ones, this bounds what is kept from above by 0-18 %
    (tests/unit/scripts/test_pipeline_memory.py checks the bound on a drafter)."""
    layer = draft_layer_settings(
        config
    )  # the draft layer's shape (an MLA target's drafter has standard heads)
    hidden, mlp = layer["hidden_size"], layer["intermediate_size"]
    kv = layer["num_key_value_heads"] * layer["head_dim"]
    return 4 * ttt_steps * (18 * hidden + 4 * mlp + 2 * (ttt_steps + 1) * kv)


def train_micro_batch(target: Path, recipe: str, overrides: list[str], samples: int) -> int | None:
    """The training micro batch on a GPU: as many samples of the recipe's `data.max_len` as EAGLE-3's
    activations fit in GPU_TRAIN_SHARE of the GPU's memory, a power of two (at most GPU_TRAIN_CAP and 1/16 of
    `samples`, the answers trained on). The GPU's total memory, not its free memory, so that a resumed run
    gets the same batch. None (the recipe's own) on a CPU, for a .gguf target, or where the overrides set
    `train.micro_batch_size` themselves."""
    if not torch.cuda.is_available() or any(o.startswith("train.micro_batch_size=") for o in overrides):
        return None
    config = _text_config(target)
    if config is None:
        return None
    cfg = load_config(EagleRecipe, recipe, overrides)
    per_sample = eagle3_activation_bytes(config, cfg.draft.ttt_steps) * cfg.data.max_len
    total = torch.cuda.get_device_properties(0).total_memory
    fits = min(int(total * GPU_TRAIN_SHARE // per_sample), GPU_TRAIN_CAP, samples // STEPS_PER_EPOCH_FLOOR)
    return 1 << (max(1, fits).bit_length() - 1)  # the largest power of two <= fits
