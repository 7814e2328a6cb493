"""DFlash (Chen, Liang, Liu 2026; z-lab/dflash): a block drafted in one forward, per docs/ALGORITHMS-BLOCK.md
section 1.

The drafter is N Qwen3-style decoder layers without an embedding or LM head of their own (it borrows the
target's, frozen). Target features of the chosen layers are fused once per token,

    c_t = hidden_norm(fc(cat_l h_t^(l)))          one context row per committed token, no residual stream

and injected into EVERY draft layer as keys and values beside the block's own rows:

    x = input_layernorm(u)                          u: the block stream, [x_a, MASK, ..., MASK] embedded
    q = rope(q_norm(W_q x))                         queries from the block only
    k = rope(k_norm(W_k [c ; x]))  v = W_v [c ; x]  the same projections for context and block rows
    u = u + W_o attn(q, k, v);  u = u + mlp(post_attention_layernorm(u))
    logits = target_lm_head(norm(u))               slot k (k >= 1) drafts the token at position a+k

A block anchored at a sees the context strictly before a (the anchor is the bonus token, whose target feature
does not exist yet at inference) and all B slots of itself, nothing else. Context keys and values depend on c
only, so inference caches them per committed token; the block's rows are dropped after each pass.

The attention is written here rather than taken from transformers: no transformers layer takes its keys and
values from a second stream (KV injection is the point of the architecture). The projections, norms, MLP
and rotary embedding are transformers' Qwen3 modules, so the weights have the names engines load.

Layer ids are canonical (docs/ALGORITHMS.md 1.2: id i = the stream entering layer i). DFlash taps layer
OUTPUTS: z-lab's target layer id j is canonical j + 1; the exporters translate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .draft_layer import draft_layer_config
from .parts import DrafterOnTarget


@dataclass
class DFlashConfig:
    """DFlash hyper-parameters (the `draft:` section of recipes/dflash/*.yaml)."""

    block_size: int = field(
        default=8,
        metadata={"help": "B: slots per block; one pass drafts B-1 tokens (peers: 16 for 8B targets)."},
    )
    num_layers: int = field(
        default=1, metadata={"help": "N: draft decoder layers (peers: 5 for 8B targets)."}
    )
    feature_layers: list[int] | None = field(
        default=None,
        metadata={
            "help": "Canonical ids of the target layers fused into the context (id i = the stream entering "
            "layer i); default: z-lab's spread over layers 1..L-3 as outputs, i.e. canonical 2..L-2."
        },
    )
    num_feature_layers: int = field(
        default=0, metadata={"help": "How many layers the default taps spread over; 0 = num_layers (z-lab)."}
    )
    mask_token_id: int | None = field(
        default=None,
        metadata={
            "help": "Token whose (frozen, target) embedding fills slots 1..B-1; default: the tokenizer's mask "
            "token, else the first unused embedding row, else pad, eos, unk."
        },
    )
    num_anchors: int = field(
        default=64, metadata={"help": "Blocks sampled per sequence per step (peers: 512 at length 3-4k)."}
    )
    decay_gamma: float = field(
        default=7.0,
        metadata={
            "help": "Slot k's loss weight exp(-(k-1)/gamma) (z-lab: 7 for B=16, 4 for B=8); 0 = uniform."
        },
    )

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"draft.block_size must be >= 2 (slot 0 is the anchor), got {self.block_size}")
        if self.num_layers < 1:
            raise ValueError(f"draft.num_layers must be >= 1, got {self.num_layers}")
        if self.num_anchors < 1:
            raise ValueError(f"draft.num_anchors must be >= 1, got {self.num_anchors}")
        if self.decay_gamma < 0:
            raise ValueError(f"draft.decay_gamma must be >= 0 (0 = uniform), got {self.decay_gamma}")
        if self.feature_layers is not None and not self.feature_layers:
            raise ValueError("draft.feature_layers is empty: list canonical ids, or null for the default")


def default_feature_layers(num_layers: int, count: int) -> list[int]:
    """z-lab's taps as canonical ids: outputs of layers round(1 + i (L-4)/(n-1)) (the middle one for n = 1),
    plus one (Qwen3-8B, L = 36, n = 5: outputs 1, 9, 17, 25, 33 = canonical 2, 10, 18, 26, 34)."""
    if count < 1:
        raise ValueError(f"DFlash needs at least one target layer, got {count}")
    if count == 1:
        outputs = [num_layers // 2]
    else:
        if num_layers < 4:
            raise ValueError(
                f"a {num_layers}-layer target is too shallow for the default taps; set draft.feature_layers"
            )
        outputs = [int(round(1 + i * (num_layers - 4) / (count - 1))) for i in range(count)]
        if len(set(outputs)) < count:
            raise ValueError(
                f"a {num_layers}-layer target has no {count} distinct default DFlash taps; set draft.feature_layers "
                "(canonical ids) or lower draft.num_feature_layers"
            )
    return [o + 1 for o in outputs]


def pick_mask_token(tokenizer: Any, embedding_rows: int, explicit: int | None = None) -> int:
    """The mask token: `explicit`, else the tokenizer's mask token, else the first embedding row no token uses
    (Qwen3: 151669), else pad, eos, unk. Its target embedding row is what slots 1..B-1 read. A real token used as
    the mask is harmless: slots are told apart by position, and drafts equal to it are kept (never stripped)."""
    candidates = [explicit, getattr(tokenizer, "mask_token_id", None)]
    if len(tokenizer) < embedding_rows:
        candidates.append(len(tokenizer))
    candidates += [
        getattr(tokenizer, name, None) for name in ("pad_token_id", "eos_token_id", "unk_token_id")
    ]
    for token in candidates:
        if isinstance(token, int) and 0 <= token < embedding_rows:
            return token
    raise ValueError(
        "no mask token for DFlash: the tokenizer has no mask, pad, eos or unk token and the embedding no spare "
        "row; set draft.mask_token_id to a token id"
    )


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, context: int, block: int) -> torch.Tensor:
    """The training attention mask `[R, 1, N*B, context + N*B]` bool (True = attend), for R rows of N blocks.

    Query (j, k) sees context t iff t < anchors[j] (strictly: never the anchor's own feature), and every slot
    of its own block j (bidirectional), nothing of other blocks. A padding block (keep False) sees only itself:
    it has no loss weight, and a row with no key at all would make attention NaN.
    """
    R, N = anchors.shape
    q = torch.arange(N * block, device=anchors.device)
    blk = q // block  # [Q] block of each query
    t = torch.arange(context, device=anchors.device)
    ctx = (t[None, None, :] < anchors[:, blk, None]) & keep[:, blk, None]  # [R, Q, context]
    own = (blk[:, None] == blk[None, :]).expand(R, -1, -1)  # [R, Q, Q]
    return torch.cat([ctx, own], dim=-1)[:, None]


class DFlashLayer(nn.Module):
    """One DFlash decoder layer: a Qwen3 layer whose keys and values also read the context rows `c`."""

    def __init__(self, config: Any, layer_idx: int):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3MLP, Qwen3RMSNorm

        self.layer_idx = layer_idx
        self.self_attn = Qwen3Attention(config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def _heads(self, proj: nn.Module, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """`[R, T, H] -> [R, heads, T, head_dim]` through `proj` (and the per-head `norm`)."""
        out = proj(x).view(*x.shape[:2], -1, self.self_attn.head_dim)
        return (norm(out) if norm is not None else out).transpose(1, 2)

    def forward(
        self,
        u: torch.Tensor,
        context: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        rope_k: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: Any = None,
    ) -> torch.Tensor:
        """`u [R, Q, H]` block stream, `context [R, C, H]` new context rows; `rope_*` = (cos, sin) of the
        queries' and the new keys' positions; `cache`: earlier context keys/values (appended to)."""
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        attn = self.self_attn
        x = self.input_layernorm(u)
        kv_in = torch.cat([context, x], dim=1)
        q = self._heads(attn.q_proj, x, attn.q_norm)
        k = self._heads(attn.k_proj, kv_in, attn.k_norm)
        v = self._heads(attn.v_proj, kv_in, None)
        q, _ = apply_rotary_pos_emb(q, q, *rope_q)
        k, _ = apply_rotary_pos_emb(k, k, *rope_k)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        u = u + attn.o_proj(out.transpose(1, 2).reshape(*u.shape[:2], -1))
        return u + self.mlp(self.post_attention_layernorm(u))


class DFlashDraft(DrafterOnTarget):
    """DFlash drafter.

    Args:
        config: hyper-parameters; `mask_token_id` must be resolved (`pick_mask_token`) before construction.
        target_config: the target's transformers config.
        vocab_size: the target's vocabulary (the drafter drafts over all of it through the target's head).
    """

    kind = "dflash"  # its record in models/families.py

    def __init__(self, config: DFlashConfig, target_config: Any, vocab_size: int):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        if config.mask_token_id is None:
            raise ValueError("DFlashDraft needs a resolved draft.mask_token_id (see pick_mask_token)")
        self.mask_token_id: int = config.mask_token_id
        self.config = config
        self.target_config = target_config
        self.layer_config = draft_layer_config(target_config, vocab_size, layer="qwen3")
        self.layer_config.num_hidden_layers = config.num_layers
        self.layer_config.layer_types = ["full_attention"] * config.num_layers
        H = int(self.layer_config.hidden_size)
        self.hidden_size, self.vocab_size, self.draft_vocab_size = H, vocab_size, vocab_size
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        L = int(text.num_hidden_layers)
        count = config.num_feature_layers or config.num_layers
        self.feature_layers = tuple(
            int(i) for i in (config.feature_layers or default_feature_layers(L, count))
        )
        self.fc = nn.Linear(len(self.feature_layers) * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(self.layer_config, i) for i in range(config.num_layers))
        self.norm = Qwen3RMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=self.layer_config)
        self.frozen = None

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Fused context rows `[.., |T| H] -> [.., H]`, in the draft's dtype (a bfloat16 target or cache feeds
        a float32 draft trained without autocast)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def run(
        self,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache: Any = None,
    ) -> torch.Tensor:
        """The block stream after every layer `[R, Q, H]` (before `norm`; `logits` applies it).

        Args:
            context: `[R, C, H]` context rows (`context(features)`) not yet in `cache`.
            context_positions: `[R, C]` their positions.
            block_ids: `[R, Q]` the blocks' tokens (anchor, then mask tokens).
            block_positions: `[R, Q]` their positions (anchor + slot).
            mask: `[R, 1, Q, C_cached + C + Q]` bool, or None (every query sees every key).
            cache: a transformers cache of earlier context keys/values, extended by context AND block rows (the
                caller crops the block rows away).
        """
        u = self._parts().embed_tokens(block_ids).to(context.dtype)
        rope_q = self.rotary_emb(u, block_positions)
        rope_k = self.rotary_emb(u, torch.cat([context_positions, block_positions], dim=1))
        for layer in self.layers:
            u = layer(u, context, rope_q, rope_k, mask, cache)
        return u

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary `[.., V]` through the frozen target head."""
        return self.target_logits(self.norm(hidden))

    def blocks(
        self, input_ids: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """`(block ids [R, N*B], positions [R, N*B])` of the blocks anchored at `anchors [R, N]`: slot 0 holds
        the anchor token (the mask token in a padding block), slots 1..B-1 the mask token; position a + k."""
        B = self.block_size
        ids = torch.full((*anchors.shape, B), self.mask_token_id, device=anchors.device, dtype=torch.long)
        ids[..., 0] = torch.where(keep, input_ids.gather(1, anchors), ids[..., 0])
        positions = anchors[..., None] + torch.arange(B, device=anchors.device)
        return ids.flatten(1), positions.flatten(1)

    def forward(
        self, features: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        """Training: every sampled block at once. `features [R, S, |T| H]`, `input_ids [R, S]`, `anchors [R, N]`,
        `keep [R, N]` -> the block stream `[R, N*B, H]` (slot k of block j at index j*B + k)."""
        R, S = input_ids.shape
        ids, positions = self.blocks(input_ids, anchors, keep)
        context_positions = torch.arange(S, device=input_ids.device).expand(R, -1)
        mask = block_mask(anchors, keep, S, self.block_size)
        return self.run(self.context(features), context_positions, ids, positions, mask)
