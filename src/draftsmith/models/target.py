"""The frozen target model: canonical feature layer ids, their capture, and its identity (loading: target_load.py).

Canonical layer id `i` (an int in 0..L) is the residual stream entering decoder layer `i` (pre-norm):
0 is the embedding output, `i` the output of layer `i-1`, and `L` the output of the last layer before the
final norm. `"final"` is the post-final-norm state that the LM head reads (Medusa's and EAGLE-1's feature).
For ids 0..L-1 and "final" this matches transformers' `output_hidden_states` tuple (whose last entry is
post-norm); id L has no entry there, so it is taken with a forward pre-hook on the final norm.

Features are captured with hooks on the model's own modules (never a copied modeling file), and only the
requested ids are kept alive, which matters for big targets and long sequences.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from .identity import sha256_text, tokenizer_fingerprint, weights_fingerprint
from .parts import with_cache
from .target_load import TargetConfig, check_vocabulary, load_pretrained
from .target_parts import PlainEmbedding, TargetHead, foldable_input

logger = logging.getLogger(__name__)

# A decoder layer's input (0..L, L = the final norm's input), the post-norm state ("final"), or the target's own
# greedy next token at each position ("top1": int64 [B, T], the argmax of its logits; cached so that training on
# text the target did not write can use the target's predictions as hard labels without its LM head).
LayerId = int | Literal["final", "top1"]
TOP1: LayerId = "top1"
# Positions whose logits are materialized at once for "top1" (512 x 49,152 float32 = 96 MiB; 262k: 512 MiB).
TOP1_CHUNK = 512


class FrozenTarget:
    """A Hugging Face causal LM, frozen, that returns hidden states at canonical layer ids.

    Args:
        model: a `PreTrainedModel` with a causal-LM head.
        tokenizer: its tokenizer.
        name_or_path: where it came from (Hub id or directory), recorded in drafter checkpoints.
        revision: the Hub revision, if any.
    """

    def __init__(self, model: Any, tokenizer: Any, name_or_path: str, revision: str | None = None):
        # `model` is a transformers PreTrainedModel; typed Any because its config and submodules are dynamic.
        self.model: Any = model.requires_grad_(False).eval()
        self.tokenizer = tokenizer
        self.name_or_path = name_or_path
        self.revision = revision
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers: int = int(text_config.num_hidden_layers)
        self.hidden_size: int = int(text_config.hidden_size)
        self.vocab_size: int = int(self.model.get_output_embeddings().weight.shape[0])
        check_vocabulary(tokenizer, self.vocab_size, name_or_path)
        self.decoder: Any = find_decoder(self.model)
        if not (hasattr(self.decoder, "layers") and hasattr(self.decoder, "norm")):
            raise ValueError(
                f"target {name_or_path!r} ({type(model).__name__}) has no `layers`/`norm` decoder modules; "
                "draftsmith supports decoder-only models laid out like Llama/Qwen/Mistral/Gemma."
            )
        # False when loaded for offline training (embedding, norm and head only): forward() then refuses.
        self.has_layers = len(self.decoder.layers) == self.num_layers
        # Set when FSDP / ZeRO-3 shard the layers (train/core/entry.py): a forward then runs every layer, since
        # ending it inside a layer's hooks would skip the engine's own hooks that free the gathered weights.
        self.sharded = False
        # generate's prefill hands the head a last-position slice, which costs a copy of the whole head per row
        # without this (target_parts.foldable_input).
        self.model.get_output_embeddings().register_forward_pre_hook(foldable_input)
        self.head = TargetHead(self.model.get_output_embeddings(), text_config)
        norm = getattr(self.decoder.norm, "weight", None)
        # Before any sharding (FSDP / ZeRO-3 later split these weights across ranks).
        self.weights_sha256 = weights_fingerprint(
            self.head.weight, norm if isinstance(norm, torch.Tensor) else None
        )
        self.embedding = PlainEmbedding(self.model.get_input_embeddings())
        if self.has_layers:
            self.check_exact()

    @classmethod
    def load(
        cls, cfg: TargetConfig, device: torch.device | str = "cpu", layers: int | None = None
    ) -> FrozenTarget:
        """Load tokenizer and model from the Hub or a local directory (no network needed for a directory).

        `layers=k` builds and loads only the embedding, the first k decoder layers, the final norm and the
        LM head (the other layers are never built nor read): training from an offline feature cache needs
        k=0, or the layers a draft LM copies. The config still reports the real layer count, so layer ids,
        drafter shapes and the identity are those of the full target; `forward` then refuses to run.
        """
        model, tokenizer = load_pretrained(cfg, torch.device(device), layers)
        return cls(model, tokenizer, cfg.path, cfg.revision)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def lm_head(self) -> nn.Linear:
        """The model's output embedding (a Linear): the raw weight. Logits come from `head`, which adds what
        the architecture applies after it (Granite's logit scaling, Gemma-2's soft-capping)."""
        head: Any = self.model.get_output_embeddings()  # transformers types it as any Module
        return head

    @property
    def embed_tokens(self) -> PlainEmbedding:
        """The input embedding as drafters use it: a plain table lookup (`embedding`), never the scale some
        decoders apply inside (see `PlainEmbedding`)."""
        return self.embedding

    @torch.no_grad()
    def check_exact(self, length: int = 8) -> None:
        """Refuse a target whose logits draftsmith would not reproduce: the decoder's output through `head`
        must equal the model's own forward (`model(...).logits`) on a few tokens. Guards every soft label,
        every T>0 verification and every feature against an architecture detail applied outside the decoder.
        """
        ids = torch.arange(length, device=self.device)[None] % self.vocab_size
        own = self.model(input_ids=ids).logits.float()
        ours = self.head(self.decoder(input_ids=ids).last_hidden_state).float()
        err = (own - ours).abs().max().item()
        if not err <= 1e-4 * max(1.0, own.abs().max().item()):
            raise ValueError(
                f"target {self.name_or_path!r} ({type(self.model).__name__}) computes its logits in a way draftsmith "
                f"does not reproduce (max difference {err:.3g} from the model's own forward); its soft labels and "
                "T>0 verification would be wrong. Please report the architecture."
            )

    def check_layer_ids(self, layer_ids: Sequence[LayerId]) -> None:
        for lid in layer_ids:
            if lid not in ("final", TOP1) and not (isinstance(lid, int) and 0 <= lid <= self.num_layers):
                raise ValueError(
                    f"layer id {lid!r} is out of range for a {self.num_layers}-layer target: "
                    f"use 0..{self.num_layers}, 'final' or 'top1'"
                )

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layer_ids: Sequence[LayerId] = ("final",),
        return_logits: bool = False,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> tuple[dict[LayerId, torch.Tensor], torch.Tensor | None]:
        """Run the target and return `({layer_id: [B, T, H]}, logits [B, T, V] or None)`; "top1" is `[B, T]`.

        The LM head runs only when `return_logits` is set: drafters that need only features skip the
        vocabulary-sized matmul. With `past_key_values` (a transformers `Cache`) the forward extends that
        cache; `attention_mask` may then be a 4D additive mask `[B, 1, T, past + T]` (tree attention) and
        `position_ids` the positions of the new tokens, both used as given.
        """
        self.check_layer_ids(layer_ids)
        if not self.has_layers:
            raise RuntimeError(
                f"target {self.name_or_path!r} was loaded without its decoder layers (training from an offline "
                "cache), so it cannot run a forward pass; this step needs the live target"
            )
        captured: dict[LayerId, torch.Tensor] = {}
        taps = [lid for lid in layer_ids if isinstance(lid, int)]  # "final" and "top1": the decoder's output
        # Features alone, without a cache to fill: the layers past the deepest tap are skipped (EAGLE-3's taps
        # 2, L//2 and L-3 leave 3 of L layers and the norm unrun in a cache build or an online step).
        output_needed = return_logits or past_key_values is not None or len(taps) < len(layer_ids)
        last = None if output_needed or self.sharded or not taps else max(taps)
        handles = []
        for lid in taps:
            module = self.decoder.norm if lid == self.num_layers else self.decoder.layers[lid]
            hook = _capture_input(captured, lid, stop=lid == last)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            out = self.decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **with_cache(self.decoder, past_key_values),
                use_cache=past_key_values is not None,
            )
        except _AllCaptured:
            return {lid: captured[lid] for lid in layer_ids}, None
        finally:
            for h in handles:
                h.remove()
        final = out.last_hidden_state  # [B, T, H], post-norm
        if "final" in layer_ids:
            captured["final"] = final
        logits = self.head(final) if return_logits else None
        if TOP1 in layer_ids:
            captured[TOP1] = logits.argmax(-1) if logits is not None else self.greedy_tokens(final)
        return {lid: captured[lid] for lid in layer_ids}, logits

    def greedy_tokens(self, final: torch.Tensor) -> torch.Tensor:
        """The target's argmax token `[...]` from post-norm states `[..., H]`, TOP1_CHUNK positions at a time (the
        full `[B, T, V]` logits of a long batch would not fit beside the model at a 262k vocabulary)."""
        flat = final.reshape(-1, final.shape[-1])
        ids = [self.head(flat[i : i + TOP1_CHUNK]).argmax(-1) for i in range(0, flat.shape[0], TOP1_CHUNK)]
        return (
            torch.cat(ids).reshape(final.shape[:-1])
            if ids
            else flat.new_zeros(final.shape[:-1], dtype=torch.long)
        )

    def batch_features(
        self, batch: dict[str, torch.Tensor], layer_ids: Sequence[LayerId], return_logits: bool = False
    ) -> tuple[dict[LayerId, torch.Tensor], torch.Tensor | None]:
        """The features (and logits) of a training batch: taken from the batch when an offline cache put
        them there (`feat.<id>` entries; the logits recomputed from `feat.final` through the frozen LM
        head), else computed by `forward`."""
        if not any(k.startswith(FEATURE_PREFIX) for k in batch):
            return self.forward(batch["input_ids"], batch["attention_mask"], layer_ids, return_logits)
        needed = list(layer_ids) + (["final"] if return_logits and "final" not in layer_ids else [])
        missing = [lid for lid in needed if feature_key(lid) not in batch]
        if missing:
            raise KeyError(
                f"the batch's cached features lack layer ids {missing}; rebuild the cache for this recipe"
            )
        dtype = self.lm_head.weight.dtype
        feats = {
            lid: batch[feature_key(lid)] if lid == TOP1 else batch[feature_key(lid)].to(dtype)
            for lid in layer_ids
        }
        logits = self.head(batch[feature_key("final")].to(dtype)) if return_logits else None
        return feats, logits

    def identity(self) -> dict[str, Any]:
        """What a drafter checkpoint records about the target it was trained for."""
        template = getattr(self.tokenizer, "chat_template", None)
        return {
            "name_or_path": self.name_or_path,
            "revision": self.revision,
            "model_type": getattr(self.model.config, "model_type", None),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "tokenizer_sha256": tokenizer_fingerprint(self.tokenizer),
            "chat_template_sha256": sha256_text(template) if isinstance(template, str) else None,
            "weights_sha256": self.weights_sha256,
        }


def find_decoder(model: Any) -> Any:
    """The decoder stack (`layers`, `norm`) of a causal LM. `get_decoder()` returns it for most models, but the
    model itself for some (Llama-4 text in transformers 5), whose stack is then `model.model`."""
    decoder = model.get_decoder()
    if not hasattr(decoder, "layers") and hasattr(decoder, "model"):
        decoder = decoder.model
    return decoder


FEATURE_PREFIX = "feat."  # batch keys of features read from an offline cache (train/cache/store.py)


def feature_key(lid: LayerId) -> str:
    """The batch / cache-shard key of layer `lid`'s features."""
    return f"{FEATURE_PREFIX}{lid}"


class _AllCaptured(Exception):
    """Raised by the deepest tap's hook when nothing after it is needed: it ends the decoder's forward there."""


def _capture_input(store: dict[LayerId, torch.Tensor], lid: LayerId, stop: bool = False) -> Any:
    """A pre-hook that stores the module's input hidden states (positional or keyword) under `lid`, then with
    `stop` ends the forward (`_AllCaptured`)."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        store[lid] = args[0] if args else kwargs["hidden_states"]
        if stop:
            raise _AllCaptured

    return hook


def stop_token_ids(target: FrozenTarget) -> set[int]:
    """End-of-sequence ids: the tokenizer's eos plus the generation config's (an int or a list)."""
    ids: set[int] = set()
    for value in (
        target.tokenizer.eos_token_id,
        getattr(target.model.generation_config, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
