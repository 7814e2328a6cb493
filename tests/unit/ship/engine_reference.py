"""Loaders written from the engines' documented layouts (docs/ENGINES.md section 2), in plain torch.

They read an export directory by the engine's names and compute what the engine's draft module computes
(Llama attention with default RoPE and grouped KV heads, SwiGLU MLP, RMSNorm), sharing no code with
draftsmith's models: the oracle that an export means what was trained, where no engine code is installable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def read(
    export_dir: Path, weights: str = "model.safetensors"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return json.loads((export_dir / "config.json").read_text()), load_file(str(export_dir / weights))


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on `[T, heads, d]`."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(u: torch.Tensor, w: dict[str, torch.Tensor], p: str, cfg: dict[str, Any]) -> torch.Tensor:
    """Causal self-attention of one sequence `u [T, in]` with the weights under prefix `p`."""
    T = u.shape[0]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (u @ w[p + "self_attn.q_proj.weight"].T).view(T, nh, hd)
    k = (u @ w[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd)
    v = (u @ w[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd)
    if cfg.get("model_type") == "qwen3":  # Qwen3 attention: RMSNorm over each head's q and k, before RoPE
        q = rms(q, w[p + "self_attn.q_norm.weight"], cfg["rms_norm_eps"])
        k = rms(k, w[p + "self_attn.k_norm.weight"], cfg["rms_norm_eps"])
    pos = torch.arange(T)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return o.transpose(0, 1).reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T


def mlp(x: torch.Tensor, w: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    return (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T


def eagle3_step0(
    export_dir: Path,
    features: torch.Tensor,
    next_ids: torch.Tensor,
    embedding: torch.Tensor,
    prefix: str,
    cfg_key: str | None = None,
) -> torch.Tensor:
    """Official (`midlayer.`) or speculators (`layers.0.`) EAGLE-3: first-step logits over the TARGET vocabulary
    (-inf outside the draft vocabulary), `features [T, 3H]`, `next_ids [T]` (token t+1 at column t)."""
    config, w = read(export_dir)
    cfg = config[cfg_key] if cfg_key else config
    cfg = {**cfg, "rope_theta": cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]}
    eps = cfg["rms_norm_eps"]
    hidden = features @ w["fc.weight"].T
    u = torch.cat(
        [
            rms(embedding[next_ids], w[prefix + "input_layernorm.weight"], eps),
            rms(hidden, w[prefix + "hidden_norm.weight"], eps),
        ],
        -1,
    )
    a = hidden + attention(u, w, prefix, cfg)
    a = a + mlp(rms(a, w[prefix + "post_attention_layernorm.weight"], eps), w, prefix)
    for i in range(1, cfg.get("num_hidden_layers", 1)):  # vLLM: layers >= 1 are plain Llama layers on H
        p = f"layers.{i}."
        a = a + attention(rms(a, w[p + "input_layernorm.weight"], eps), w, p, cfg)
        a = a + mlp(rms(a, w[p + "post_attention_layernorm.weight"], eps), w, p)
    draft_logits = rms(a, w["norm.weight"], eps) @ w["lm_head.weight"].T
    if "d2t" not in w:  # no map (vLLM, a full draft vocabulary): draft id i is target id i
        return draft_logits
    out = torch.full((features.shape[0], embedding.shape[0]), float("-inf"))
    out[:, torch.arange(w["d2t"].shape[0]) + w["d2t"]] = draft_logits
    return out


def eagle1_step(
    export_dir: Path,
    features: torch.Tensor,
    next_ids: torch.Tensor,
    embedding: torch.Tensor,
    lm_head: torch.Tensor,
) -> torch.Tensor:
    """Official EAGLE-1: logits of the predicted next feature through the target's LM head."""
    cfg, w = read(export_dir)
    x = torch.cat([embedding[next_ids], features], -1) @ w["fc.weight"].T
    if cfg.get("bias") or cfg.get("eagle_fc_bias"):
        x = x + w["fc.bias"]
    x = x + attention(x, w, "layers.0.", cfg)  # layer 0: no input norm
    x = x + mlp(rms(x, w["layers.0.post_attention_layernorm.weight"], cfg["rms_norm_eps"]), w, "layers.0.")
    return x @ lm_head.T


def medusa_heads(export_dir: Path, hidden: torch.Tensor, layout: str) -> torch.Tensor:
    """vLLM (`blocks.i.layers.j`, `lm_heads.i`) or FasterDecoding (`i.j.linear`, `i.n`) heads: `[K, T, V]`."""
    if layout == "vllm":
        cfg, w = read(export_dir)
        K, n = cfg["num_heads"], cfg["num_hidden_layers"]
        block, head = "blocks.{i}.layers.{j}.", "lm_heads.{i}.weight"
        bias = cfg.get("medusa_fc_bias", False)
    else:
        cfg, w = read(export_dir, "medusa_lm_head.safetensors")
        K, n = cfg["medusa_num_heads"], cfg["medusa_num_layers"]
        block, head = "{i}.{j}.linear.", "{i}.{n}.weight"
        bias = True  # the FasterDecoding ResBlock's Linear has a bias
    outs = []
    for i in range(K):
        x = hidden
        for j in range(n):
            p = block.format(i=i, j=j)
            x = x + F.silu(x @ w[p + "weight"].T + (w[p + "bias"] if bias else 0))
        outs.append(x @ w[head.format(i=i, n=n)].T)
    return torch.stack(outs)


def nextn_module1(export_dir: Path, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """DeepSeek nextn: the first MTP layer (model.layers.{L}) on the target's last residual stream `hidden`
    and the embedding of token t+1 at column t -> logits of token t+2, with the layer's own shared tensors."""
    cfg, w = read(export_dir)
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    cfg = {
        **cfg,
        "rope_theta": cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"],
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
    }
    p = f"model.layers.{L}."
    emb = w[p + "embed_tokens.weight"][next_ids]
    x = torch.cat([rms(emb, w[p + "enorm.weight"], eps), rms(hidden, w[p + "hnorm.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    x = x + attention(rms(x, w[p + "input_layernorm.weight"], eps), w, p, cfg)
    x = x + mlp(rms(x, w[p + "post_attention_layernorm.weight"], eps), w, p)
    return rms(x, w[p + "shared_head.norm.weight"], eps) @ w[p + "shared_head.head.weight"].T
