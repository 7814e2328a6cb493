"""The decoder layer engines serve as a draft layer, built from the target's dimensions.

SGLang and vLLM run an EAGLE head (and a generic MTP block) as a Llama-style layer whatever the target is:
q/k/v/o and gate/up/down projections without biases, RMSNorm, full rotary embeddings. So draftsmith builds
the draft layer as transformers' own Llama modules with the target's hidden size, heads, head_dim,
activation, rope settings and max positions, and never from the target's class: a Qwen2 qkv bias, Qwen3 /
OLMo-2 q/k norms, Phi-3 fused projections, MLA, MoE experts or attention sinks would give tensors the engines'
draft architectures do not have (and an MoE layer built outside its model has uninitialised experts).

speculators also serves a qwen3 draft layer (q/k norms; vLLM only), built here on request (`layer="qwen3"`).

`draft_layer_settings` is the one source of these values: the drafter modules are built from it and the
exporters write and validate engine configs from it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .parts import with_cache
from .ttt_attention import ATTENTION_NAME


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rope_parameters(config: Any) -> dict[str, Any]:
    """The target's rope settings for full-attention layers, as transformers 5 `rope_parameters`.

    Gemma-3 keeps one set per layer type (the full-attention one is the long-context one); the partial
    rotary factor of Qwen3-Next / GLM-4 is dropped: an engine's Llama draft rotates the whole head.
    """
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        theta = getattr(config, "rope_theta", 10000.0)
        scaling = getattr(config, "rope_scaling", None) or {}
        params = {"rope_theta": theta, "rope_type": "default", **scaling}
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]
    params = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def draft_layer_settings(target_config: Any) -> dict[str, Any]:
    """The draft layer's shape and positional settings, from the target's config (never defaulted where the
    target says otherwise). Multi-head latent attention targets (DeepSeek-V3, Kimi) get standard heads of
    hidden / num_heads, since their MLA head_dim describes only the rotary part."""
    c = _text_config(target_config)
    H, nh = int(c.hidden_size), int(c.num_attention_heads)
    mla = getattr(c, "kv_lora_rank", None) is not None
    head_dim = getattr(c, "head_dim", None)
    return {
        "hidden_size": H,
        "intermediate_size": int(c.intermediate_size),
        "num_attention_heads": nh,
        "num_key_value_heads": nh if mla else int(getattr(c, "num_key_value_heads", None) or nh),
        "head_dim": H // nh if mla or not head_dim else int(head_dim),
        "max_position_embeddings": int(c.max_position_embeddings),
        "rope_parameters": rope_parameters(c),
        "rms_norm_eps": float(getattr(c, "rms_norm_eps", None) or 1e-6),
        "hidden_act": str(getattr(c, "hidden_act", None) or getattr(c, "hidden_activation", None) or "silu"),
        "attention_bias": False,
        "mlp_bias": False,
    }


DRAFT_LAYERS = ("llama", "qwen3")


def draft_layer_config(target_config: Any, vocab_size: int | None = None, layer: str = "llama") -> Any:
    """A one-layer transformers config with the draft layer settings: `LlamaConfig`, or `Qwen3Config` for
    speculators' qwen3 draft layer (the Llama layer plus a per-head RMSNorm on q and k), SDPA attention."""
    from transformers import LlamaConfig, Qwen3Config

    if layer not in DRAFT_LAYERS:
        raise ValueError(f"draft layer {layer!r}: use one of {', '.join(DRAFT_LAYERS)}")
    c = _text_config(target_config)
    cls = Qwen3Config if layer == "qwen3" else LlamaConfig
    config = cls(
        **draft_layer_settings(c),
        num_hidden_layers=1,
        vocab_size=int(vocab_size or c.vocab_size),
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    return config


class DecoderBlock(nn.Module):
    """The parts of a Llama-style decoder layer and its computation on what attention reads (`block`); its
    subclasses say in `forward` what that is (DraftLayer: the caller's input; P-EAGLE's later layers: their own
    input norm of the residual).

    Args: as DraftLayer's.
    """

    def __init__(self, target_config: Any, attn_in_features: int | None = None, layer: str = "llama"):
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaAttention,
            LlamaMLP,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

        self.config = draft_layer_config(target_config, layer=layer)
        # SDPA for every explicit mask, and EAGLE-3's TTT pattern without a materialised mask.
        self.config._attn_implementation = ATTENTION_NAME
        H = int(self.config.hidden_size)
        attention = Qwen3Attention if layer == "qwen3" else LlamaAttention
        self.self_attn = attention(self.config, layer_idx=0)
        self.mlp = LlamaMLP(self.config)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=self.config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=self.config)
        if attn_in_features is not None:  # EAGLE-3: q/k/v read the 2H concatenation
            for name in ("q_proj", "k_proj", "v_proj"):
                old = getattr(self.self_attn, name)
                setattr(self.self_attn, name, nn.Linear(attn_in_features, old.out_features, bias=False))

    def norm(self) -> nn.Module:
        """A fresh RMSNorm of the draft's width (EAGLE-3's input, hidden and final norms)."""
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        return LlamaRMSNorm(int(self.config.hidden_size), eps=self.config.rms_norm_eps)

    def block(
        self,
        residual: torch.Tensor,
        attn_input: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: Any,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """`x = residual + attn(attn_input); out = x + mlp(post_norm(x))`."""
        position_embeddings = self.rotary_emb(residual, position_ids)
        h, _ = self.self_attn(
            hidden_states=attn_input,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            **with_cache(self.self_attn, past_key_values),
        )
        x = residual + h
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftLayer(DecoderBlock):
    """One Llama-style decoder layer run without its input norm:
    `x = residual + attn(u); out = x + mlp(post_norm(x))`, where `u` is what the caller feeds attention
    (EAGLE-1: the fc output itself; EAGLE-3: cat(norm(embedding), norm(hidden)), 2H wide).

    Args:
        target_config: the target's transformers config (dimensions and rope settings).
        attn_in_features: width of `u` when it is not the hidden size (EAGLE-3: 2H).
        layer: "llama" (what every engine serves), or "qwen3": the same layer with a per-head RMSNorm on q and
            k (`self_attn.q_norm` / `k_norm`), speculators' qwen3 draft layer, which only vLLM serves.
    """

    def forward(
        self,
        residual: torch.Tensor,
        attn_input: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        return self.block(residual, attn_input, position_ids, attention_mask, past_key_values)


class InputNormLayer(DecoderBlock):
    """A standard Llama decoder layer on H, `x + attn(input_layernorm(x))` then the MLP: the layers after
    EAGLE-3's fused first one (a deeper EAGLE-3's, `draft.num_layers`, and P-EAGLE's)."""

    def __init__(self, target_config: Any, layer: str, layer_idx: int):
        super().__init__(target_config, layer=layer)
        self.self_attn.layer_idx = layer_idx  # its own slot in a shared cache
        self.input_layernorm = self.norm()

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, mask: Any, cache: Any = None
    ) -> torch.Tensor:
        return self.block(x, self.input_layernorm(x), position_ids, mask, cache)
