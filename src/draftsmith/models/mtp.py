"""DeepSeek-V3-style multi-token-prediction (MTP) modules on a frozen target (ALGORITHMS.md section 7.1).

D sequential modules. Module k (k = 1..D) at column i reads the previous module's output h^{k-1}_i (h^0: the
target's last residual stream, canonical id L, pre-norm) and the embedding of token t_{i+k}:

    h'_i = eh_proj(cat(enorm(embed(t_{i+k})), hnorm(h^{k-1}_i)))     embedding FIRST, as released checkpoints
    h^k  = block_k(h')                                                 one decoder layer of the target's class,
                                                                       causal over the columns
    logits^k_i = lm_head(shared_head_norm_k(h^k_i))  -> t_{i+k+1}      the target's embedding and head, frozen

Loss: (lambda / D) * sum_k CE(logits^k_i, t_{i+k+1}) over the columns whose predicted token is an answer
token. Nothing is copied from transformers' modeling files. The block (with its input norm: MTP blocks are
full transformer blocks) is the target family's own decoder layer where engines serve that family's native
MTP (DeepSeek-V3, Qwen3-Next, Qwen3.5: `NATIVE_MTP`), else a Llama-style block with the target's
dimensions (models/draft_layer.py), which only draftsmith's evaluator runs.

Export layout (`nextn_state_dict`), DeepSeek-V3's `num_nextn_predict_layers` style: module k (1-based) of a
target with L layers is the extra decoder layer `model.layers.{L + k - 1}`:

    model.layers.{n}.enorm.weight / hnorm.weight           the two RMSNorms (embedding, hidden)
    model.layers.{n}.eh_proj.weight [H, 2H]                 input = cat(enorm(emb), hnorm(h)), embedding first
    model.layers.{n}.input_layernorm.weight, self_attn.*, post_attention_layernorm.weight, mlp.*   the block
    model.layers.{n}.shared_head.norm.weight                the module's final norm
    model.layers.{n}.shared_head.head.weight [V, H]         the target's LM head (a copy, bit-identical)
    model.layers.{n}.embed_tokens.weight [V, H]             the target's embedding (a copy, bit-identical)

with `num_nextn_predict_layers: D` in the config. `load_nextn_state_dict` reads it back and refuses a
missing or unknown tensor, or a shared tensor that is not the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .draft_layer import draft_layer_config
from .parts import DrafterOnTarget, FrozenParts, causal_mask


@dataclass
class MTPConfig:
    """MTP hyper-parameters (the `draft:` section of recipes/mtp/*.yaml)."""

    num_modules: int = field(default=2, metadata={"help": "D: sequential modules; module k predicts t+k+1."})
    loss_weight: float = field(default=1.0, metadata={"help": "lambda: the loss is lambda/D * sum_k CE_k."})

    def __post_init__(self) -> None:
        if not 1 <= self.num_modules <= 4:
            raise ValueError(f"draft.num_modules must be 1..4, got {self.num_modules}")
        if self.loss_weight <= 0:
            raise ValueError(f"draft.loss_weight must be > 0, got {self.loss_weight}")


def shift_tokens(input_ids: torch.Tensor, k: int) -> torch.Tensor:
    """Column i holds t_{i+k}; the last k columns (no such token) hold 0 and are never trained."""
    if k == 0:
        return input_ids
    return torch.cat([input_ids[:, k:], torch.zeros_like(input_ids[:, :k])], dim=1)


# Target model type -> the native MTP layout engines load for it (DeepSeek-V3's nextn layer; Qwen3-Next /
# Qwen3.5's `mtp.*`). The MTP family record names this table as the targets engines serve MTP beside
# (models/families.py `served_targets`); export picks the layout from it (ship/layouts/mtp.py). Modules for
# these targets use the family's own decoder layer; every other target gets a Llama-style block.
NATIVE_MTP = {
    "deepseek_v3": "nextn",
    "qwen3_next": "qwen3-mtp",
    "qwen3_5_text": "qwen3-mtp",
    "qwen3_5": "qwen3-mtp",
}


def native_block(target_config: Any) -> tuple[nn.Module, nn.Module]:
    """The target family's own decoder layer (full attention, MoE where the family's MTP layer has it) and
    rotary embedding, with the model's own initialisation: built as a one-layer model of that family (a
    layer constructed alone would leave MoE experts and routers uninitialised)."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target_config.get_text_config())
    config.num_hidden_layers = 1
    config.vocab_size = 8  # the embedding and head of this throw-away model are not used
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"]
    if hasattr(config, "first_k_dense_replace"):
        config.first_k_dense_replace = 0  # DeepSeek-V3's MTP layer is an MoE layer
    config._attn_implementation = "sdpa"
    decoder = AutoModelForCausalLM.from_config(config).get_decoder()
    return decoder.layers[0], decoder.rotary_emb


class MTPModule(nn.Module):
    """One depth: enorm, hnorm, eh_proj, a full decoder block, and its own final norm."""

    def __init__(self, target_config: Any):
        super().__init__()
        if str(getattr(target_config, "model_type", "")) in NATIVE_MTP:
            self.block, self.rotary_emb = native_block(target_config)
            config = target_config.get_text_config()
            norm_cls: Any = type(self.block.input_layernorm)
            eps = float(getattr(config, "rms_norm_eps", 1e-6))
        else:
            from transformers.models.llama.modeling_llama import (
                LlamaDecoderLayer,
                LlamaRMSNorm,
                LlamaRotaryEmbedding,
            )

            config = draft_layer_config(target_config)
            self.block = LlamaDecoderLayer(config, layer_idx=0)
            self.rotary_emb = LlamaRotaryEmbedding(config=config)
            norm_cls, eps = LlamaRMSNorm, float(config.rms_norm_eps)
        H = int(config.hidden_size)
        self.enorm = norm_cls(H, eps=eps)
        self.hnorm = norm_cls(H, eps=eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head_norm = norm_cls(H, eps=eps)

    def forward(
        self, hidden: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        out = self.block(
            x,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=self.rotary_emb(x, position_ids),
        )
        return out[0] if isinstance(out, tuple) else out


class MTPDraft(DrafterOnTarget):
    """D MTP modules sharing the target's frozen embedding and LM head (attached, never saved).

    Args:
        config: hyper-parameters.
        target_config: the target's transformers config (block shape, rotary settings).
        vocab_size: the target's vocabulary size (the head is the target's).
    """

    kind = "mtp"  # its record in models/families.py

    def __init__(self, config: MTPConfig, target_config: Any, vocab_size: int):
        super().__init__()
        self.config = config
        self.target_config = target_config
        self.vocab_size = vocab_size
        self.draft_vocab_size = vocab_size
        self.feature_layers = (int(target_config.num_hidden_layers),)  # the last residual stream, pre-norm
        self.layers = nn.ModuleList(MTPModule(target_config) for _ in range(config.num_modules))
        self.frozen = None

    def logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Module k's (1-based) logits over the target vocabulary from its output `[.., H]`."""
        module: Any = self.layers[k - 1]
        return self.target_logits(module.shared_head_norm(hidden))

    def forward(
        self, features: torch.Tensor, input_ids: torch.Tensor, project: bool = True
    ) -> list[torch.Tensor]:
        """All depths, teacher-forced: `features [B, T, H]` (h^0), `input_ids [B, T]` -> D logits `[B, T, V]`;
        entry k-1 at column i predicts t_{i+k+1}. With `project=False`, the modules' outputs h^k `[B, T, H]`
        instead (training applies `logits` one sequence chunk at a time)."""
        B, T = input_ids.shape
        mask = causal_mask(T, features.device)
        positions = torch.arange(T, device=features.device)[None].expand(B, T)
        # In the draft's dtype: a bfloat16 target or cache feeds a float32 draft trained without autocast.
        first: Any = self.layers[0]
        dtype = first.eh_proj.weight.dtype
        hidden, out = features.to(dtype), []
        for k in range(1, self.config.num_modules + 1):
            embeds = self._parts().embed_tokens(shift_tokens(input_ids, k)).to(dtype)
            hidden = self.layers[k - 1](hidden, embeds, positions, mask)
            out.append(self.logits(k, hidden) if project else hidden)
        return out


_SHARED = {"shared_head.head.weight": "lm_head", "embed_tokens.weight": "embed_tokens"}


def shared_weight(parts: FrozenParts, attr: str) -> torch.Tensor:
    weight: Any = getattr(parts, attr).weight
    return weight


def nextn_tensors(
    state: dict[str, torch.Tensor], num_layers: int, embedding: torch.Tensor, lm_head: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The DeepSeek nextn layout (module docstring) of an MTPDraft state dict, with copies of the target's
    `embedding` and `lm_head` weights as each module's shared tensors."""
    out: dict[str, torch.Tensor] = {}
    modules = sorted({int(name.split(".")[1]) for name in state if name.startswith("layers.")})
    for name, tensor in state.items():
        index, _, rest = name.removeprefix("layers.").partition(".")
        if rest.startswith("rotary_emb."):
            continue
        rest = rest.removeprefix("block.").replace("shared_head_norm.", "shared_head.norm.")
        out[f"model.layers.{num_layers + int(index)}.{rest}"] = tensor.detach().clone()
    for k in modules:
        out[f"model.layers.{num_layers + k}.shared_head.head.weight"] = lm_head.detach().clone()
        out[f"model.layers.{num_layers + k}.embed_tokens.weight"] = embedding.detach().clone()
    return out


def nextn_state_dict(draft: MTPDraft) -> dict[str, torch.Tensor]:
    """The DeepSeek nextn layout of `draft` (attached to its target), with the shared tensors copied in."""
    parts = draft._parts()
    return nextn_tensors(
        draft.state_dict(),
        int(draft.target_config.num_hidden_layers),
        shared_weight(parts, "embed_tokens"),
        shared_weight(parts, "lm_head"),
    )


def load_nextn_state_dict(draft: MTPDraft, state: dict[str, torch.Tensor]) -> None:
    """Load a nextn-layout state dict into `draft` (attached to its target), validating it.

    Raises:
        ValueError: a missing or unexpected tensor, a wrong shape, or shared tensors that differ from the
            target's embedding / LM head (an export with a random embed_tokens runs at tau ~1 in engines).
    """
    L = int(draft.target_config.num_hidden_layers)
    parts = draft._parts()
    expected = nextn_state_dict(draft)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"nextn state dict: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"nextn state dict: {key} has shape {tuple(tensor.shape)}, expected {tuple(expected[key].shape)}"
            )
    for k, module in enumerate(draft.layers):
        prefix = f"model.layers.{L + k}."
        for name, attr in _SHARED.items():
            if not torch.equal(
                state[prefix + name].to(getattr(parts, attr).weight), getattr(parts, attr).weight
            ):
                raise ValueError(f"nextn state dict: {prefix + name} is not the target's {attr}")
        own = {}
        for name in module.state_dict():
            if name.startswith("rotary_emb."):
                continue
            exported = name.removeprefix("block.").replace("shared_head_norm.", "shared_head.norm.")
            own[name] = state[prefix + exported]
        module.load_state_dict(own, strict=False)
