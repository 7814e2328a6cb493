"""P-EAGLE (parallel EAGLE; Hui et al. 2026): EAGLE-3 that drafts all K tokens in ONE forward, per
docs/ALGORITHMS-BLOCK.md section 2 (the EAGLE-3 parts are docs/ALGORITHMS.md section 5).

Inputs and head are EAGLE-3's: g_t = cat of three pre-norm target layers, fc = Linear(3H, H), the reduced
draft vocabulary with d2t / t2d. The network is N decoder layers: layer 0 is EAGLE-3's fused layer (q/k/v read
cat(norm_in(embedding), norm_hidden(a)), residual a), layers 1..N-1 are standard Llama layers on H.

A row of the draft's sequence is an item (a, d): anchor column a, depth d, RoPE position a + d.

    d = 0:  hidden fc(g_a),            token embedding(x_{a+1})      (the real pair, as EAGLE-3's step 0)
    d >= 1: hidden fc(mask_hidden),    the mask embedding            (mask_hidden: learned, [3H], pre-fc)
    item (a, d) predicts x_{a+d+2}     (EAGLE-3's TTT step d at column a)

    allowed(q, kv) = (d_kv = 0 and a_kv <= a_q) or (a_kv = a_q and d_kv <= d_q)

causal over the real columns, causal within a rollout. At inference the K drafts after a root come from the
last real row and K-1 mask rows behind it in one pass, and the rule above is a plain causal mask there.

The mask embedding: draftsmith's EAGLE heads borrow the target's frozen embedding; P-EAGLE's peers train the
mask token's row. Here it is one learned vector `mask_embedding [H]` initialised from the target's row of
`mask_token_id`; real tokens always read the target's rows, and a row is a mask row by its role, never by its
token id (a real token equal to the mask id is embedded as itself). The vector is frozen when the mask id is an
ordinary token (`pick_mask_token`'s last resort), because an engine embeds that token with the same row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from .draft_layer import InputNormLayer
from .eagle3 import Eagle3Parts
from .parts import shift_left

MaskEmbedding = Literal["auto", "learned", "frozen"]


@dataclass
class PEagleConfig:
    """P-EAGLE hyper-parameters (the `draft:` section of recipes/peagle/*.yaml)."""

    feature_layers: list[int] | None = field(
        default=None,
        metadata={"help": "Canonical ids of the 3 pre-norm target layers (default 2, L//2, L-3)."},
    )
    draft_vocab_size: int = field(
        default=0, metadata={"help": "Draft vocabulary (most frequent assistant tokens); 0 = the target's."}
    )
    head_init: Literal["random", "target"] = field(
        default="random",
        metadata={"help": "Draft head: random (the peers), or the target's final norm and LM-head rows."},
    )
    layer: Literal["llama", "qwen3"] = field(
        default="llama", metadata={"help": "Draft layers: llama, or speculators' qwen3 layer (q/k norms)."}
    )
    num_layers: int = field(
        default=4,
        metadata={"help": "N decoder layers: the EAGLE-3 fused layer, then N-1 Llama layers (peers: 4)."},
    )
    num_depths: int = field(
        default=8,
        metadata={"help": "D depths trained in parallel = the most tokens one pass drafts (peers: 8)."},
    )
    cod_ratio: float = field(
        default=0.8,
        metadata={"help": "COD sampling: depth d keeps a share max(r^d, r_min) of the trained columns."},
    )
    cod_min_ratio: float = field(
        default=0.2, metadata={"help": "COD sampling: the floor r_min of that share."}
    )
    mask_token_id: int | None = field(
        default=None,
        metadata={
            "help": "Token id whose row the engine reads at mask slots; null = the tokenizer's mask token, else the "
            "first unused embedding row, else pad, eos, unk (then the mask embedding stays frozen)."
        },
    )
    mask_embedding: MaskEmbedding = field(
        default="auto",
        metadata={
            "help": "learned / frozen mask embedding; auto = learned unless the mask id is an ordinary token."
        },
    )

    def __post_init__(self) -> None:
        if self.feature_layers is not None and len(self.feature_layers) != 3:
            raise ValueError(
                f"draft.feature_layers needs 3 layer ids (low, mid, high), got {self.feature_layers}"
            )
        if self.num_layers < 1:
            raise ValueError(f"draft.num_layers must be >= 1 (layer 0 is EAGLE-3's), got {self.num_layers}")
        if self.num_depths < 1:
            raise ValueError(f"draft.num_depths must be >= 1, got {self.num_depths}")
        if not 0 < self.cod_ratio <= 1 or not 0 <= self.cod_min_ratio <= 1:
            raise ValueError(
                f"draft.cod_ratio must be in (0, 1] and draft.cod_min_ratio in [0, 1], got {self.cod_ratio}, "
                f"{self.cod_min_ratio}"
            )
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"draft.draft_vocab_size must be >= 0 (0 = full vocabulary), got {self.draft_vocab_size}"
            )
        if self.layer not in ("llama", "qwen3") or self.head_init not in ("random", "target"):
            raise ValueError(
                f"draft.layer must be llama|qwen3 and draft.head_init random|target, got "
                f"{self.layer!r}, {self.head_init!r}"
            )
        if self.mask_embedding not in ("auto", "learned", "frozen"):
            raise ValueError(
                f"draft.mask_embedding must be auto, learned or frozen, got {self.mask_embedding!r}"
            )


def pick_mask_token(tokenizer: Any, embedding_rows: int, explicit: int | None = None) -> tuple[int, bool]:
    """`(mask token id, dedicated)`: `explicit`, else the tokenizer's mask token, else the first embedding row no
    token uses (`len(tokenizer)`: Qwen3's 151669), else pad, eos, unk. `dedicated` is False for the last resort
    (an ordinary token): its row must stay the target's, since an engine embeds that token with the same row."""
    special = getattr(tokenizer, "mask_token_id", None)
    if explicit is not None:
        if not 0 <= explicit < embedding_rows:
            raise ValueError(
                f"draft.mask_token_id={explicit} is not a row of the {embedding_rows}-row embedding"
            )
        return explicit, explicit == special or explicit >= len(tokenizer)
    if isinstance(special, int) and 0 <= special < embedding_rows:
        return special, True
    if len(tokenizer) < embedding_rows:
        return len(tokenizer), True
    for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
        token = getattr(tokenizer, name, None)
        if isinstance(token, int) and 0 <= token < embedding_rows:
            return token, False
    raise ValueError(
        "no mask token for P-EAGLE: the tokenizer has no mask, pad, eos or unk token and the embedding no spare row; "
        "set draft.mask_token_id to a token id"
    )


def cod_sample(
    trained: torch.Tensor, num_depths: int, ratio: float, min_ratio: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """COD sampling of one sequence's items (docs/ALGORITHMS-BLOCK.md section 2.2).

    Depth 0 keeps every column; depth d >= 1 picks n_d = min(floor((M - d) max(r^d, r_min)), |candidates|)
    positions uniformly among the candidates (M = trained columns), where a candidate position t = a + d must
    be trained and extend an item (a, d-1) picked at the depth before (depth 0: every trained t >= 1).

    Args:
        trained: `[S]` bool over the sequence's real columns: column t is trained (loss mask and a real t+1).
        num_depths: D; sampling also stops at the first depth with no item.
        generator: a CPU generator (the draw is reproducible from its seed).

    Returns:
        `(anchors [N], depths [N], inclusion [N])`: anchors and depths long, depth-major, anchors ascending within
        a depth (position = a + d); inclusion float, the item's chance of being drawn given its chain's depth-0
        item, prod_{k<=d} n_k / |candidates_k| (1 at depth 0; D-PACE's inverse-probability weights need it).
    """
    trained = trained.bool().cpu()
    S, M = trained.shape[0], int(trained.sum())
    anchors, depths = [torch.arange(S)], [torch.zeros(S, dtype=torch.long)]
    inclusion, chance = [torch.ones(S, dtype=torch.float64)], 1.0
    prev = trained.nonzero().flatten()
    for d in range(1, num_depths):
        cand = prev[prev >= d]
        n = min(int((M - d) * max(ratio**d, min_ratio)), cand.numel())
        if n <= 0:
            break
        pick = (
            cand
            if n == cand.numel()
            else cand[torch.randperm(cand.numel(), generator=generator)[:n]].sort().values
        )
        anchors.append(pick - d)
        depths.append(torch.full((n,), d, dtype=torch.long))
        chance *= n / cand.numel()
        inclusion.append(torch.full((n,), chance, dtype=torch.float64))
        nxt = pick + 1
        prev = nxt[nxt < S][trained[nxt[nxt < S]]]
    return torch.cat(anchors), torch.cat(depths), torch.cat(inclusion).float()


def item_mask(anchors: torch.Tensor, depths: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The training attention mask `[B, 1, N, N]` bool (True = attend) of B rows of N items (one sequence per row).

    allowed(q, kv) = valid both and [(d_kv = 0 and a_kv <= a_q) or (a_kv = a_q and d_kv <= d_q)]; a padding item
    sees itself only (a row with no key would make attention NaN). Dense: B N^2 bytes, and SDPA keeps a float
    copy for backward (4 B N^2 per layer); COD at r = 0.8, 8 depths gives N ~ 4.2 T.
    """
    aq, ak = anchors[:, :, None], anchors[:, None, :]
    dq, dk = depths[:, :, None], depths[:, None, :]
    rule = ((dk == 0) & (ak <= aq)) | ((ak == aq) & (dk <= dq))
    allowed = rule & valid[:, :, None] & valid[:, None, :]
    eye = torch.eye(anchors.shape[1], dtype=torch.bool, device=anchors.device)
    return (allowed | (eye & ~valid[:, :, None]))[:, None]


class PEagleDraft(Eagle3Parts):
    """P-EAGLE drafter.

    Args:
        config: hyper-parameters with `mask_token_id` resolved (`pick_mask_token`) and `mask_embedding` not auto.
        target_config: the target's transformers config.
        draft_vocab_size: size of the reduced vocabulary (the target's vocabulary size for none).
    """

    kind = "peagle"  # its record in models/families.py

    def __init__(self, config: PEagleConfig, target_config: Any, draft_vocab_size: int):
        super().__init__()
        if config.mask_token_id is None or config.mask_embedding == "auto":
            raise ValueError(
                "PEagleDraft needs a resolved draft.mask_token_id and mask_embedding (pick_mask_token)"
            )
        self.config, self.target_config = config, target_config
        self._init_input(target_config, config.feature_layers, config.layer)  # EAGLE-3's fc and fused layer
        self.later = nn.ModuleList(
            InputNormLayer(target_config, config.layer, i) for i in range(1, config.num_layers)
        )
        self._init_head(draft_vocab_size)  # EAGLE-3's norms, head and vocabulary map
        H = self.hidden_size
        self.mask_hidden = nn.Parameter(torch.randn(3 * H))  # N(0, 1) as the peers
        learned = config.mask_embedding == "learned"
        self.mask_embedding = nn.Parameter(torch.zeros(H), requires_grad=learned)
        self.frozen = None

    @torch.no_grad()
    def init_mask_embedding(self, embedding_weight: torch.Tensor) -> None:
        """Start the mask embedding as the target's row of `mask_token_id`."""
        self.mask_embedding.copy_(embedding_weight[int(self.config.mask_token_id)])  # type: ignore[arg-type]

    def embed(self, ids: torch.Tensor, is_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Token embeddings `[B, N, H]`: the target's rows, the mask embedding where `is_mask` (by role, not id)."""
        emb = self._parts().embed_tokens(ids).to(dtype)
        return torch.where(is_mask[..., None], self.mask_embedding.to(dtype), emb)

    def mask_state(self) -> torch.Tensor:
        """fc(mask_hidden) `[H]`: the hidden input of every mask row."""
        return self.fc(self.mask_hidden.to(self.fc.weight.dtype))

    def run(
        self,
        hidden: torch.Tensor,
        emb: torch.Tensor,
        position_ids: torch.Tensor,
        mask: Any,
        cache: Any = None,
    ) -> torch.Tensor:
        """The N layers on rows with their (post-fc) hidden inputs and embeddings `[B, N, H]` -> outputs `[B, N, H]`."""
        x = self.fused_layer(hidden, emb, position_ids, mask, cache)
        for layer in self.later:
            x = layer(x, position_ids, mask, cache)
        return x

    def forward(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        depths: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """The training forward: one pass over every item, before the head.

        Args:
            features: `[B, T, 3H]` g; input_ids: `[B, T]`.
            anchors, depths, valid: `[B, N]` items (`cod_sample`, padded; padding items are invalid).

        Returns:
            `[B, N, H]`: item (a, d)'s output, which predicts x_{a+d+2}.
        """
        root = depths == 0
        rows = torch.arange(features.shape[0], device=features.device)[:, None]
        g = features[rows, anchors]  # [B, N, 3H]
        projected = self.project(g)  # in the draft's dtype, whatever the features'
        hidden = torch.where(root[..., None], projected, self.mask_state().to(projected.dtype))
        tokens = shift_left(input_ids)[rows, anchors]
        emb = self.embed(tokens, ~root, hidden.dtype)
        return self.run(hidden, emb, anchors + depths, item_mask(anchors, depths, valid))
