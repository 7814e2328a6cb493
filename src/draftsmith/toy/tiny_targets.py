"""Tiny random-weight targets of the architectures people serve drafters for, built in-process.

Each entry builds a 2-4 layer model with transformers' own config and model classes (no download, no
copied modeling code) and every architecture detail that changes what the target computes switched on:
tied or untied embeddings, GQA, llama3 rope scaling, qkv bias, q/k norms, fused projections, MoE routing,
MLA, sliding-window and hybrid (linear-attention) layers, attention sinks, scaled embeddings, final-logit
soft-capping, Granite's logit scaling. Acceptance on these means nothing (the weights are random); they
prove that every drafter kind trains, decodes losslessly and exports on every architecture.

    from draftsmith.toy.tiny_targets import ARCHITECTURES, build_tiny_target
    model = build_tiny_target("gemma2", tokenizer)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Shared small shape: hidden 64, 4 heads of 16 (2 KV heads), MLP 128.
_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Architecture:
    """One architecture of the matrix: its name, transformers config class name and settings."""

    name: str
    config_class: str
    settings: dict[str, Any]
    note: str  # what this entry exercises

    def config(self, vocab_size: int, layers: int | None = None) -> Any:
        import transformers

        cls: Callable[..., Any] = getattr(transformers, self.config_class)
        kwargs = {**_BASE, **self.settings, "vocab_size": vocab_size}
        if layers is not None:  # more layers: the layer-type pattern repeats
            kwargs["num_hidden_layers"] = layers
            types = kwargs.get("layer_types")
            if isinstance(types, list):
                kwargs["layer_types"] = [types[i % len(types)] for i in range(layers)]
            if "no_rope_layers" in kwargs:
                kwargs["no_rope_layers"] = [kwargs["no_rope_layers"][i % 4] for i in range(layers)]
        kwargs = {k: v for k, v in kwargs.items() if v is not _DROP}
        return cls(**kwargs)


_DROP = object()  # a _BASE key an architecture's config does not take

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in [
        Architecture("llama", "LlamaConfig", {}, "untied embeddings, GQA"),
        Architecture("llama_tied", "LlamaConfig", {"tie_word_embeddings": True}, "tied embeddings"),
        Architecture(
            "llama3_rope",
            "LlamaConfig",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
            },
            "llama3 rope scaling",
        ),
        Architecture("mistral", "MistralConfig", {"sliding_window": None}, "Mistral"),
        Architecture(
            "mixtral",
            "MixtralConfig",
            {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
            "MoE (8 experts in the real model)",
        ),
        Architecture("qwen2", "Qwen2Config", {"use_sliding_window": False}, "qkv bias"),
        Architecture("qwen3", "Qwen3Config", {"use_sliding_window": False}, "q/k norms"),
        Architecture(
            "qwen3_moe",
            "Qwen3MoeConfig",
            {
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "decoder_sparse_step": 1,
            },
            "MoE with q/k norms",
        ),
        Architecture(
            "qwen3_next",
            "Qwen3NextConfig",
            {
                "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32,
                "linear_num_value_heads": 4,
                "linear_num_key_heads": 2,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "partial_rotary_factor": 0.25,
            },
            "hybrid linear attention (gated delta net) + MoE, gated attention",
        ),
        Architecture(
            "qwen3_5",
            "Qwen3_5TextConfig",
            {
                "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                "linear_num_value_heads": 4,
                "linear_num_key_heads": 2,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
            },
            "Qwen3.5 text: hybrid linear attention",
        ),
        Architecture(
            "gemma2",
            "Gemma2Config",
            {
                "sliding_window": 8,
                "final_logit_softcapping": 30.0,
                "attn_logit_softcapping": 50.0,
                "query_pre_attn_scalar": 16,
                "tie_word_embeddings": True,
            },
            "scaled embeddings, sliding window 8, logit soft-capping",
        ),
        Architecture(
            "gemma3",
            "Gemma3TextConfig",
            {
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "query_pre_attn_scalar": 16,
                "tie_word_embeddings": True,
            },
            "scaled embeddings, sliding window 8 every other layer, q/k norms",
        ),
        Architecture("phi3", "Phi3Config", {"head_dim": _DROP, "pad_token_id": 0}, "fused qkv / gate_up"),
        Architecture("glm4", "Glm4Config", {"partial_rotary_factor": 0.5}, "extra norms, partial rotary"),
        Architecture("olmo2", "Olmo2Config", {"head_dim": _DROP}, "post-norms, q/k norms"),
        Architecture(
            "granite",
            "GraniteConfig",
            {
                "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22,
                "attention_multiplier": 0.0625,
                "logits_scaling": 8.0,
                "head_dim": _DROP,
            },
            "embedding / residual / attention multipliers, logits scaling",
        ),
        Architecture("smollm3", "SmolLM3Config", {"no_rope_layer_interval": 2}, "NoPE every other layer"),
        Architecture(
            "deepseek_v3",
            "DeepseekV3Config",
            {
                "q_lora_rank": 32,
                "kv_lora_rank": 16,
                "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 8,
                "v_head_dim": 16,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "n_shared_experts": 1,
                "first_k_dense_replace": 1,
                "n_group": 2,
                "topk_group": 1,
                "head_dim": 8,
                "num_key_value_heads": 4,
            },
            "MLA + MoE (first layer dense)",
        ),
        Architecture(
            "gpt_oss",
            "GptOssConfig",
            {
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "sliding_window": 8,
                "layer_types": None,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 150000.0,
                    "factor": 4.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "original_max_position_embeddings": 256,
                },
            },
            "attention sinks, MoE, alternating sliding window 8",
        ),
        Architecture(
            "llama4",
            "Llama4TextConfig",
            {
                "num_local_experts": 2,
                "num_experts_per_tok": 1,
                "intermediate_size_mlp": 128,
                "interleave_moe_layer_step": 2,
                "attention_chunk_size": 8,
                "no_rope_layers": [1, 1, 1, 0],
                "use_qk_norm": True,
            },
            "Llama-4 text: MoE every other layer, chunked attention, a NoPE layer",
        ),
    ]
}


def available(name: str) -> bool:
    """Whether the installed transformers ships `name`'s config class."""
    import transformers

    return hasattr(transformers, ARCHITECTURES[name].config_class)


def build_tiny_target(name: str, tokenizer: Any, seed: int = 0, layers: int | None = None) -> Any:
    """A random-weight causal LM of architecture `name` for `tokenizer` (its vocabulary size and special
    token ids), float32, in eval mode; `layers` overrides the layer count (4).

    Weights come from the model's own `_init_weights` (every expert and router included), so they are
    finite; the result is deterministic for a seed.
    """
    from transformers import AutoModelForCausalLM

    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    config = ARCHITECTURES[name].config(len(tokenizer), layers)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, key, getattr(tokenizer, key, None))
    config._attn_implementation = "eager" if name in ("gemma2", "gpt_oss") else "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise RuntimeError(f"{name}: non-finite initial weights in {bad[:3]}")
    return model
