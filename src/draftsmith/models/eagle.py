"""EAGLE-1 (Li et al. 2024; SafeAILab/EAGLE), per ALGORITHMS.md sections 1.2, 1.3 and 3, plus what EAGLE-1 and
EAGLE-3 share: the config (the draft layer is models/draft_layer.py, the target attachment models/parts.py).

EAGLE-1 autoregresses on the target's post-norm last hidden state ("final"). At column t it reads the pair
(f_t, x_{t+1}) and predicts the feature f_{t+1}; the frozen target LM head turns that into a distribution over
x_{t+2}:

    x = fc(cat(embed(x_{t+1}), f_t))           embedding FIRST, Linear(2H, H, bias per config)
    x = x + attn(x)                            layer 0 has NO input norm: fc output goes straight in
    f_hat = x + mlp(post_attention_norm(x))    no final norm; logits = target_lm_head(f_hat)

The embedding and LM head are the target's, frozen, and never saved with the drafter. The layer is the
Llama-style layer engines serve as a draft (models/draft_layer.py), with the target's dimensions and rope
settings whatever the target's own class is, driven here with 4D masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from .draft_layer import DraftLayer
from .parts import DrafterOnTarget, causal_mask


@dataclass
class EagleConfig:
    """EAGLE drafter hyper-parameters (the `draft:` section of recipes/eagle/*.yaml)."""

    version: Literal[1, 3] = field(default=3, metadata={"help": "1 = EAGLE-1 (features), 3 = EAGLE-3 (TTT)."})
    feature_layers: list[int] | None = field(
        default=None,
        metadata={"help": "EAGLE-3: canonical ids of the 3 pre-norm target layers (default 2, L//2, L-3)."},
    )
    draft_vocab_size: int = field(
        default=0,
        metadata={"help": "EAGLE-3: draft vocabulary (most frequent assistant tokens); 0 = the target's."},
    )
    ttt_steps: int = field(default=7, metadata={"help": "EAGLE-3: training-time-test steps unrolled."})
    step_decay: float = field(
        default=0.8, metadata={"help": "EAGLE-3: loss weight of TTT step s is decay**s."}
    )
    head_init: Literal["random", "target"] = field(
        default="random",
        metadata={
            "help": "EAGLE-3: initialise the draft head randomly (the paper's code) or from the target's "
            "final norm and LM-head rows of the draft vocabulary (trains faster at small budgets)."
        },
    )
    layer_init: Literal["random", "target", "copy"] = field(
        default="random",
        metadata={
            "help": "EAGLE-3: start the draft layer randomly, or from the target's last decoder layer (its "
            "projections, MLP and norms; the embedding half of q/k/v stays random; Llama-style targets), or "
            "randomly with its first key/value group built as a copy head (models/copy_head.py)."
        },
    )
    freeze_copy_head: Literal["off", "head", "head_and_fc"] = field(
        default="off",
        metadata={
            "help": "EAGLE-3 with layer_init=copy: keep the copy head as built while the rest of the layer trains. "
            "head: its query heads, kv head, output columns and fc's first-tap columns get no gradient; "
            "head_and_fc: all of fc too (the key reads fc's output, which training of the later taps' columns "
            "would otherwise change)."
        },
    )
    labels: Literal["target", "data", "top1"] = field(
        default="target",
        metadata={
            "help": "EAGLE-3: what each draft position learns. target: the frozen target's distribution (soft "
            "cross-entropy; the offline cache holds the target's last state). data: the data's next token "
            "(cross-entropy; no target head in training, no last state cached): the same argmax when the data "
            "are the target's own greedy answers (`draftsmith data regenerate --temperature 0`), at 0.65x the "
            "step time on SmolLM2 (docs/BENCHMARKS.md). top1: the target's own greedy next token at each position "
            "(cross-entropy), computed once with the features (the cache holds it as int32): for text the target "
            "did not write (documents, human or other models' answers), at the step time of `data`."
        },
    )
    reach_topk: int = field(
        default=0,
        metadata={
            "help": "EAGLE-3: GRIFFIN's token-alignable loss (arXiv 2502.11018). TTT step s trains a column only "
            "where the label of every earlier step was among the draft's top-k there: decoding reaches depth s+1 "
            "only through accepted drafts, so columns it never reaches take no capacity. 0 = off (every column "
            "trains at every step); 1 fits a chain, k a tree of k branches."
        },
    )
    copy_weight: float = field(
        default=0.0,
        metadata={
            "help": "EAGLE-3: extra loss weight where prompt lookup (the latest earlier occurrence of the last 1-3 "
            "tokens) would draft the label: 1 + copy_weight there, 1 elsewhere (train/prompt_lookup.py). Meant to "
            "teach copying, where prompt lookup beats the drafter; on chat answers 2 did not (-2 %, "
            "docs/BENCHMARKS.md). 0 = off."
        },
    )
    copy_attention: float = field(
        default=0.0,
        metadata={
            "help": "EAGLE-3: weight of a loss on the attention of the fused layer's first key/value group (the copy "
            "head of layer_init=copy, or any group 0): at each answer position whose next token repeats an "
            "earlier continuation of the current token, -log of the attention that group puts on those earlier "
            "columns (train/prompt_lookup.py). Teaches the head to find what prompt lookup copies, with fc and "
            "the rest of the layer free to train. 0 = off."
        },
    )
    train_on: Literal["answers", "all"] = field(
        default="answers",
        metadata={
            "help": "Which positions train. answers: the assistant tokens (the data's loss mask). all: every real "
            "token, the prompts' too, each labelled with the target's own prediction there (labels top1 or "
            "target): more supervised positions from the same conversations. The held-out metrics stay on the "
            "answers either way."
        },
    )
    hass_topk: int = field(
        default=0,
        metadata={
            "help": "EAGLE-3 with labels=target: HASS's harmonized objective (arXiv 2408.15766). Each step's loss "
            "adds hass_weight x the soft cross-entropy over the target's k most likely tokens, the tokens a "
            "draft is accepted with. 0 = off; HASS uses k 10 and weight 1."
        },
    )
    hass_weight: float = field(default=1.0, metadata={"help": "EAGLE-3: weight of hass_topk's term."})
    layer: Literal["llama", "qwen3"] = field(
        default="llama",
        metadata={
            "help": "EAGLE-3: the draft decoder layer. llama: served by vLLM and SGLang. qwen3: speculators' "
            "qwen3 layer (q/k RMSNorm per head; steadier at high learning rates), served by vLLM only."
        },
    )
    num_layers: int = field(
        default=1,
        metadata={
            "help": "EAGLE-3: decoder layers. 1 = the paper's fused layer; N > 1 adds N-1 standard Llama layers on "
            "its output (vLLM serves them, num_hidden_layers; SGLang serves one layer only)."
        },
    )
    fc_bias: bool = field(
        default=False,
        metadata={
            "help": "EAGLE-1: bias of fc (Llama-3 configs false; Vicuna configs true). vLLM's EAGLE-1 has no fc "
            "bias, so a drafter trained with one exports to SGLang only."
        },
    )
    noise: Literal["uniform", "none"] = field(
        default="uniform", metadata={"help": "EAGLE-1: noise on the input features during training."}
    )
    noise_std: float = field(
        default=0.2,
        metadata={
            "help": "EAGLE-1: noise (U[0,1) - 0.5) * std * 512 / T, as the reference code (T = length)."
        },
    )
    reg_weight: float = field(default=1.0, metadata={"help": "EAGLE-1: weight of the SmoothL1 feature loss."})
    cls_weight: float = field(default=0.1, metadata={"help": "EAGLE-1: weight of the soft cross-entropy."})

    def __post_init__(self) -> None:
        if self.version not in (1, 3):
            raise ValueError(f"draft.version must be 1 (EAGLE-1) or 3 (EAGLE-3), got {self.version!r}")
        if self.ttt_steps < 1:
            raise ValueError(f"draft.ttt_steps must be >= 1, got {self.ttt_steps}")
        self._check_loss_options()
        if self.feature_layers is not None and len(self.feature_layers) != 3:
            raise ValueError(
                f"draft.feature_layers needs 3 layer ids (low, mid, high), got {self.feature_layers}"
            )
        if self.num_layers < 1 or (self.num_layers > 1 and self.version != 3):
            raise ValueError(
                f"draft.num_layers is EAGLE-3's layer count (>= 1), got {self.num_layers} with version "
                f"{self.version}; EAGLE-1 engines serve one layer"
            )
        if self.layer not in ("llama", "qwen3"):
            raise ValueError(f"draft.layer must be 'llama' or 'qwen3', got {self.layer!r}")
        if self.layer != "llama" and self.version != 3:
            raise ValueError(
                f"draft.layer={self.layer} is an EAGLE-3 option (speculators' draft layers); EAGLE-1 engines serve "
                "only the Llama layer: drop draft.layer or set draft.version=3"
            )
        if self.labels not in ("target", "data", "top1"):
            raise ValueError(f"draft.labels must be 'target', 'data' or 'top1', got {self.labels!r}")
        if self.labels != "target" and self.version != 3:
            raise ValueError(
                f"draft.labels={self.labels} is EAGLE-3's option; EAGLE-1 regresses the target's next features, which need "
                "the target: drop draft.labels or set draft.version=3"
            )
        self._check_init_options()
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"draft.draft_vocab_size must be >= 0 (0 = full vocabulary), got {self.draft_vocab_size}"
            )

    def _check_init_options(self) -> None:
        """How the draft layer and head start, and whether the copy head stays as built."""
        if self.layer_init not in ("random", "target", "copy") or (
            self.layer_init != "random" and self.version != 3
        ):
            raise ValueError(
                f"draft.layer_init is EAGLE-3's, 'random', 'target' or 'copy'; got {self.layer_init!r}"
            )
        if self.freeze_copy_head not in ("off", "head", "head_and_fc") or (
            self.freeze_copy_head != "off" and self.layer_init != "copy"
        ):
            raise ValueError(
                f"draft.freeze_copy_head is 'off', 'head' or 'head_and_fc', and keeps the copy head of "
                f"draft.layer_init=copy (got {self.freeze_copy_head!r} with layer_init {self.layer_init!r})"
            )
        if self.head_init not in ("random", "target"):
            raise ValueError(f"draft.head_init must be 'random' or 'target', got {self.head_init!r}")

    def _check_loss_options(self) -> None:
        """EAGLE-3's loss options: GRIFFIN's reach mask and HASS's top-k term."""
        if self.reach_topk < 0 or (self.reach_topk and self.version != 3):
            raise ValueError(
                f"draft.reach_topk is EAGLE-3's (0 = off, k >= 1 = top-k), got {self.reach_topk} with version "
                f"{self.version}"
            )
        if self.hass_topk < 0 or (self.hass_topk and (self.version != 3 or self.labels != "target")):
            raise ValueError(
                f"draft.hass_topk distils the target's top-k tokens: it needs draft.version=3 and "
                f"draft.labels=target (got {self.hass_topk} with version {self.version}, labels {self.labels}); "
                "0 turns it off"
            )
        if self.copy_weight < 0 or (self.copy_weight and self.version != 3):
            raise ValueError(
                f"draft.copy_weight is EAGLE-3's extra weight (>= 0; 0 = off), got {self.copy_weight} with version "
                f"{self.version}"
            )
        if not (math.isfinite(self.copy_attention) and self.copy_attention >= 0) or (
            self.copy_attention and self.version != 3
        ):
            raise ValueError(
                f"draft.copy_attention is EAGLE-3's copy-attention loss weight (a finite number >= 0; 0 = off), "
                f"got {self.copy_attention} with version {self.version}"
            )
        if self.train_on not in ("answers", "all"):
            raise ValueError(f"draft.train_on must be 'answers' or 'all', got {self.train_on!r}")
        if self.train_on == "all" and self.labels == "data":
            raise ValueError(
                "draft.train_on=all trains the prompts' positions too, where the data's next token is the user's, "
                "not the target's: set draft.labels=top1 (or target), or draft.train_on=answers"
            )
        if not (math.isfinite(self.hass_weight) and self.hass_weight >= 0):
            raise ValueError(
                f"draft.hass_weight must be a finite number >= 0 (e.g. 1.0), got {self.hass_weight}"
            )


class _EagleBase(DrafterOnTarget):
    config: EagleConfig


class Eagle1Draft(_EagleBase):
    """EAGLE-1 drafter.

    Args:
        config: hyper-parameters (`version` must be 1).
        target_config: the target's transformers config (layer shape, rotary settings).
        vocab_size: the target's vocabulary size (EAGLE-1 uses the target's LM head, so the full vocabulary).
    """

    kind = "eagle"  # its record in models/families.py

    feature_layers: tuple[Literal["final"]] = ("final",)

    def __init__(self, config: EagleConfig, target_config: Any, vocab_size: int):
        super().__init__()
        if config.version != 1:
            raise ValueError(f"Eagle1Draft needs draft.version=1, got {config.version}")
        self.config = config
        self.target_config = target_config
        self.hidden_size = int(target_config.hidden_size)
        self.vocab_size = vocab_size
        self.fc = nn.Linear(2 * self.hidden_size, self.hidden_size, bias=config.fc_bias)
        self.layer = DraftLayer(target_config)
        self.frozen = None

    def forward(
        self,
        features: torch.Tensor,
        next_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """Predicted features `[B, T, H]`: column t reads (f_t, x_{t+1}) and predicts f_{t+1}.

        Without `attention_mask` the columns attend causally among themselves (training); with a cache,
        pass the positions and the 4D mask of the new columns.
        """
        # In the draft's dtype: a bfloat16 target or cache feeds a float32 draft trained without autocast.
        dtype = self.fc.weight.dtype
        emb = self._parts().embed_tokens(next_ids).to(dtype)
        x = self.fc(torch.cat([emb, features.to(dtype)], dim=-1))
        T = x.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=x.device)[None]
        if attention_mask is None:
            attention_mask = causal_mask(T, x.device)
        return self.layer(x, x, position_ids, attention_mask, past_key_values)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits of predicted features, through the frozen target LM head."""
        return self.target_logits(predicted)

    def input_noise(self, features: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """EAGLE-1's uniform noise on the INPUT features: (U[0,1) - 0.5) * std * 512 / T (T = sequence length,
        as in the reference code; equal to the paper's U(-0.1, 0.1) at T = 512)."""
        if self.config.noise == "none" or not self.training:
            return features
        T = features.shape[1]
        u = torch.rand(features.shape, generator=generator, device=features.device, dtype=features.dtype)
        return features + (u - 0.5) * self.config.noise_std * 512 / T
