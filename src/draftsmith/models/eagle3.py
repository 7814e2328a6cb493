"""EAGLE-3 (Li et al. 2025; SafeAILab/EAGLE traineagle3), per ALGORITHMS.md sections 1.2, 1.3, 5 and 11.

Inputs: g_t = cat of the target's PRE-norm residual streams at three canonical layer ids (low, mid, high;
default 2, L//2, L-3), projected by fc = Linear(3H, H, bias=False). One decoder step:

    u  = cat(norm_in(embed(x)), norm_h(a))        embedding FIRST; q/k/v read the 2H concatenation
    a' = a + attn(u)                              the residual is a (fc(g) at step 0, else the draft's output)
    a  = a' + mlp(post_norm(a'))
    a  = later_i(a), i = 1..N-1                   draft.num_layers = N > 1: standard Llama layers on a
    logits = lm_head_d(norm_final(a))             own head over the reduced draft vocabulary, random init
                                                  (draft.head_init=target: the target head's rows)

Reduced vocabulary: the `draft_vocab_size` most frequent assistant tokens of the training data;
`d2t[i] = used[i] - i` (an OFFSET: target id = i + d2t[i]) and `t2d` a bool mask over the target vocabulary.

Training-time test (section 5.2): S steps unrolled; at step s column t holds the draft state standing for
position t+s+1, RoPE position t+s, and attends to step-0 keys at columns <= t plus, for every later step,
ONLY its own column: exactly the mask of a chain of drafts at inference. The keys of all steps go through a
transformers cache; the draft layer's attention runs the pattern without a mask tensor (`ttt_attention`),
and `ttt_mask` is the same pattern as a tensor (the tests' oracle).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .draft_layer import InputNormLayer
from .eagle import DraftLayer, EagleConfig, _EagleBase
from .parts import DrafterOnTarget, shift_left
from .ttt_attention import TTT_PATTERN, TTTPattern


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's canonical taps: inputs of layers 2, L//2 and L-3 (for L=32: 2, 16, 29)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if not 0 < ids[0] < ids[1] < ids[2] <= num_layers:
        raise ValueError(
            f"a {num_layers}-layer target has no distinct EAGLE-3 taps 2 < L//2 < L-3; set draft.feature_layers"
        )
    return ids


def resolve_draft_vocab(configured: int, target_vocab: int) -> int:
    """The draft vocabulary a recipe's `draft.draft_vocab_size` gives (EAGLE-3, P-EAGLE): 0 means the target's
    full vocabulary (no d2t / t2d map), and a size at or above the target's is the full vocabulary too."""
    return min(configured or target_vocab, target_vocab)


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(d2t [Vd] long offsets, t2d [V] bool)` from assistant-token counts `[V]` (ties: lower id first)."""
    V = counts.shape[0]
    if not 0 < draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size must be in 1..{V}, got {draft_vocab_size}")
    order = sorted(range(V), key=lambda v: (-int(counts[v]), v))[:draft_vocab_size]
    used = torch.tensor(sorted(order), dtype=torch.long)
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def ttt_mask(length: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The TTT attention mask of step `step` (0-based): `[1, 1, T, (step+1)*T]` bool, True = attend.

    Keys are the cached steps in order: step 0 causal (column t sees columns <= t), every later step its
    diagonal only (column t sees column t). Boolean, for SDPA (an additive float mask would be 4x larger).
    """
    cols = torch.arange(length, device=device)
    causal = cols[None, :] <= cols[:, None]
    diag = cols[None, :] == cols[:, None]
    return torch.cat([causal] + [diag] * step, dim=1)[None, None]


class Eagle3Parts(DrafterOnTarget):
    """What EAGLE-3 and P-EAGLE (models/peagle.py) share: fc over the three target taps, the fused first layer
    (q/k/v read cat(norm_in(embedding), norm_hidden(a)), residual a), the reduced vocabulary map and the draft
    head. Its parameter names (fc, layer, norm_in, norm_hidden, norm_final, lm_head_d, d2t, t2d) are what
    checkpoints and engine exports read."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def _init_input(self, target_config: Any, feature_layers: list[int] | None, layer: str) -> None:
        """fc and the fused layer (built first: the seeded initialisation draws for them first)."""
        H = self.hidden_size = int(target_config.hidden_size)
        self.vocab_size = int(target_config.vocab_size)
        taps = feature_layers or default_feature_layers(int(target_config.num_hidden_layers))
        self.feature_layers = tuple(int(i) for i in taps)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.layer = DraftLayer(target_config, attn_in_features=2 * H, layer=layer)

    def _init_head(self, draft_vocab_size: int) -> None:
        """The norms, the head over the draft vocabulary and the vocabulary map (identity when it is full)."""
        self.draft_vocab_size = draft_vocab_size
        self.norm_in = self.layer.norm()
        self.norm_hidden = self.layer.norm()
        self.norm_final = self.layer.norm()
        self.lm_head_d = nn.Linear(self.hidden_size, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        full = draft_vocab_size == self.vocab_size
        self.register_buffer("t2d", torch.full((self.vocab_size,), full, dtype=torch.bool))

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        if (
            d2t.shape != self.d2t.shape
            or t2d.shape != self.t2d.shape
            or int(t2d.sum()) != self.draft_vocab_size
        ):
            raise ValueError("vocab map shapes do not match draft_vocab_size / the target vocabulary")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @torch.no_grad()
    def init_head_from_target(self, lm_head_weight: torch.Tensor, final_norm: nn.Module) -> None:
        """`draft.head_init: target`: start the draft head as the target's own head restricted to the draft
        vocabulary (rows `i + d2t[i]`) behind a copy of the target's final norm. Not in the paper's code
        (random init); at small budgets it lifts early accuracy because only the layer must be learned."""
        ids = self.to_target_ids(torch.arange(self.draft_vocab_size, device=self.d2t.device))
        self.lm_head_d.weight.copy_(lm_head_weight[ids.to(lm_head_weight.device)])
        self.norm_final.load_state_dict(final_norm.state_dict())

    @torch.no_grad()
    def init_layer_from_target(self, target_layer: nn.Module) -> None:
        """`draft.layer_init: target`: start the draft layer as the target's last decoder layer. Its output
        projection, MLP, post-attention norm (and a qwen3 layer's q/k norms) are copied; q/k/v read
        cat(norm_in(embedding), norm_hidden(hidden)), so their hidden half is the target's own projections and
        norm_hidden its input norm, while the embedding half keeps its random start. A target layer of other
        shapes (fused projections, experts, latent attention) is refused."""
        ours, H = self.layer, self.hidden_size
        names = [
            "self_attn.o_proj",
            "post_attention_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ]
        names += [n for n in ("self_attn.q_norm", "self_attn.k_norm") if _weight(ours, n) is not None]
        pairs = [(n, _weight(ours, n), _weight(target_layer, n)) for n in names]
        pairs.append(
            ("input_layernorm", _weight(self.norm_hidden, ""), _weight(target_layer, "input_layernorm"))
        )
        pairs += [
            (n, ours.get_parameter(f"{n}.weight")[:, H:], _weight(target_layer, n))
            for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
        ]
        copies = []
        for name, mine, theirs in pairs:
            if mine is None or theirs is None or mine.shape != theirs.shape:
                raise ValueError(
                    f"draft.layer_init=target: the target's last layer has no {name} of the draft layer's shape "
                    "(Llama-style q/k/v/o and gate/up/down projections); use draft.layer_init=random"
                )
            copies.append((mine, theirs))
        for mine, theirs in copies:
            mine.copy_(theirs.to(mine.dtype))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (`i + d2t[i]`)."""
        return draft_ids + self.d2t[draft_ids]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated target layers `[.., 3H] -> [.., H]`, in the draft's dtype (a bfloat16 target
        or cache feeds a float32 draft when training runs without autocast)."""
        return self.fc(features.to(self.fc.weight.dtype))

    def fused_layer(
        self,
        hidden: torch.Tensor,
        emb: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | TTTPattern,
        past_key_values: Any,
    ) -> torch.Tensor:
        """The first layer on hidden states (the residual) and token embeddings `[B, T, H]` -> `[B, T, H]`."""
        return self.layer(
            hidden, self.attention_input(hidden, emb), position_ids, attention_mask, past_key_values
        )

    def attention_input(self, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """What the fused layer's q/k/v read: `cat(norm_in(emb), norm_hidden(hidden))` `[B, T, 2H]`."""
        return torch.cat([self.norm_in(emb), self.norm_hidden(hidden)], dim=-1)

    def group_scores(
        self,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        query: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> torch.Tensor:
        """`[B, G, T, T]`: the attention scores (after 1/sqrt(head_dim), before any mask) of the G query heads
        of kv group 0 in the fused layer at TTT step 0, from its residual `hidden` (fc's output) and the input
        `ids` `[B, T]` (x_{t+1} at column t). The layer's attention kernel does not return its weights, so
        group 0's q and k are projected again from its own weight rows: the copy head's attention
        (models/copy_head.py), which `draft.copy_attention` trains and `bench.copy_head_vote` reads.
        `query`: `(hidden, ids, step)` of a later TTT step instead, its queries at positions t + step scored
        against the same step-0 keys (the part of that step's attention `bench.copy_rows --steps` reads)."""
        attn: Any = self.layer.self_attn
        hd, group = attn.head_dim, attn.num_key_value_groups
        B, T = ids.shape
        embed = self._parts().embed_tokens
        u = self.attention_input(hidden, embed(ids).to(hidden.dtype))
        uq = u if query is None else self.attention_input(query[0], embed(query[1]).to(query[0].dtype))
        q = F.linear(uq, attn.q_proj.weight[: group * hd]).view(B, T, group, hd).transpose(1, 2)
        k = F.linear(u, attn.k_proj.weight[:hd]).view(B, T, 1, hd).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # the qwen3 draft layer's per-head norms
            q, k = attn.q_norm(q), attn.k_norm(k)
        positions = torch.arange(T, device=ids.device)[None]
        cos, sin = self.layer.rotary_emb(hidden, positions)
        if query is None:  # the training step's path: one rotation for both
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        else:  # the later step's queries sit `step` positions further on
            k = apply_rotary_pos_emb(k, k, cos, sin)[0]
            q = apply_rotary_pos_emb(q, q, *self.layer.rotary_emb(hidden, positions + query[2]))[0]
        return q @ k.transpose(-1, -2) * attn.scaling

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits `[.., Vd]`."""
        return self.lm_head_d(self.norm_final(hidden))


class Eagle3Draft(_EagleBase, Eagle3Parts):
    """EAGLE-3 drafter.

    Args:
        config: hyper-parameters (`version` must be 3).
        target_config: the target's transformers config.
        draft_vocab_size: size of the reduced vocabulary (the target's vocabulary size for none).
    """

    kind = "eagle3"  # its record in models/families.py

    def __init__(self, config: EagleConfig, target_config: Any, draft_vocab_size: int):
        super().__init__()
        if config.version != 3:
            raise ValueError(f"Eagle3Draft needs draft.version=3, got {config.version}")
        self.config = config
        self.target_config = target_config
        self._init_input(target_config, config.feature_layers, config.layer)
        self.later = nn.ModuleList(
            InputNormLayer(target_config, config.layer, i) for i in range(1, config.num_layers)
        )  # empty for the paper's one layer: its checkpoints and seeded initialisation are unchanged
        self._init_head(draft_vocab_size)
        self.frozen = None

    def step(
        self,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | TTTPattern,
        past_key_values: Any,
    ) -> torch.Tensor:
        """One draft step: `hidden [B, T, H]` (fc(g) or the previous output), token ids `[B, T]` -> new hidden:
        the fused layer, then the later layers (`draft.num_layers`), each with its own slot in the cache and
        the same attention pattern."""
        emb = self._parts().embed_tokens(ids).to(hidden.dtype)
        x = self.fused_layer(hidden, emb, position_ids, attention_mask, past_key_values)
        for layer in self.later:
            x = layer(x, position_ids, attention_mask, past_key_values)
        return x

    def unroll(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """Training-time test: the draft logits `[B, T, Vd]` of every step s = 0..S-1 (`unroll_hidden`)."""
        return [self.logits(hidden) for hidden in self.unroll_hidden(features, input_ids)]

    def unroll_hidden(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """Training-time test: the draft's output `[B, T, H]` of every step s = 0..S-1, before `logits`.

        At step s, column t predicts x_{t+s+2} from the real prefix up to x_{t+1} and the draft's own s
        earlier outputs for that column (ALGORITHMS.md 1.3 / 5.2).
        """
        B, T = input_ids.shape
        hidden = self.project(features)
        ids = shift_left(input_ids)
        cache = DynamicCache()
        positions = torch.arange(T, device=hidden.device)[None]
        out = []
        for s in range(self.config.ttt_steps):
            hidden = self.step(hidden, ids, positions + s, TTT_PATTERN, cache)
            out.append(hidden)
            ids = shift_left(ids)
        return out


def _weight(module: nn.Module, name: str) -> torch.Tensor | None:
    """`module`'s parameter `name`.weight, or None when it has none (another layer design)."""
    try:
        return module.get_parameter(f"{name}.weight" if name else "weight")
    except AttributeError:
        return None
