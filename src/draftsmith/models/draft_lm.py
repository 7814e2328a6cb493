"""Independent draft language models that share the target's tokenizer.

`draft_from_target` builds the classic "copied layers" draft: the target's own architecture cut to its
first `num_layers` decoder layers, with the target's embeddings, final norm and LM head copied in. It is
what transformers' assisted generation is usually demonstrated with, and the starting point that
distillation (train/distill.py) improves on. `build_draft_lm` makes a draft as a recipe's `draft:` section
says (copied from the target, from scratch, or any causal LM directory / Hub id); `save_draft_lm` writes a
plain transformers model directory (what vLLM's draft-model method and the evaluator load) plus
`draftsmith.json` with the target it was trained for; `load_draft_lm` loads one and checks it fits.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from draftsmith.runtime.files import atomic_dir, draftsmith_version, record_hashes, write_json

from .identity import check_target_identity, tokenizer_fingerprint
from .target import FrozenTarget

logger = logging.getLogger(__name__)
METADATA_NAME = "draftsmith.json"


@dataclass
class DraftLMConfig:
    """Which draft LM to train (the `draft:` section of recipes/distill/*.yaml)."""

    init: Literal["target", "scratch", "path"] = field(
        default="target",
        metadata={
            "help": "target: the target's first `num_layers` layers, embeddings, norm and head copied; "
            "scratch: the target's architecture with `num_layers` layers, randomly initialised; "
            "path: an existing causal LM (`path`) that shares the target's tokenizer."
        },
    )
    num_layers: int = field(default=1, metadata={"help": "Decoder layers (init target / scratch)."})
    path: str = field(default="", metadata={"help": "init=path: a local model directory or Hub id."})
    config_overrides: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "init=scratch: changes to the target's config, e.g. {hidden_size: 64}."},
    )

    def __post_init__(self) -> None:
        if self.init == "path" and not self.path:
            raise ValueError("draft.init=path needs draft.path (a model directory or Hub id)")
        if self.init != "path" and self.num_layers < 1:
            raise ValueError(f"draft.num_layers must be >= 1, got {self.num_layers}")


def draft_layer_indices(config: Any, num_layers: int) -> list[int]:
    """Which target layers a `num_layers`-layer draft keeps: the first ones, except that a hybrid target whose
    first layers are all linear attention (Qwen3-Next, Qwen3.5) gets its first full-attention layer as the
    draft's last, so the draft has attention to cache (transformers needs one to track positions)."""
    keep = list(range(num_layers))
    types = getattr(config, "layer_types", None)
    if types and all(types[i] == "linear_attention" for i in keep):
        full = next((i for i, t in enumerate(types) if t != "linear_attention"), None)
        if full is not None:
            keep[-1] = full
    return keep


@torch.no_grad()
def draft_from_target(model: Any, num_layers: int) -> Any:
    """A new causal LM: `model`'s config with `num_layers` layers, weights copied from `model`'s first layers
    (see `draft_layer_indices` for hybrid targets).

    Args:
        model: a transformers causal LM laid out like Llama (`model.layers.{i}`, `model.norm`, `lm_head`).
        num_layers: how many of its decoder layers to keep (1 .. its layer count).
    """
    config = copy.deepcopy(model.config)
    total = int(config.num_hidden_layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total} (the target's layer count), got {num_layers}")
    keep = draft_layer_indices(config, num_layers)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in keep]
    draft = type(model)(config).to(dtype=model.dtype, device=model.device)
    renamed = {}
    for key, tensor in model.state_dict().items():
        match = re.search(r"\.layers\.(\d+)\.", key)
        if match is None:
            renamed[key] = tensor
        elif int(match[1]) in keep:
            renamed[key[: match.start()] + f".layers.{keep.index(int(match[1]))}." + key[match.end() :]] = (
                tensor
            )
    missing, unexpected = draft.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"cannot copy {type(model).__name__} into a {num_layers}-layer draft: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()


def build_draft_lm(cfg: DraftLMConfig, target: FrozenTarget) -> Any:
    """The draft LM `cfg` describes, on the target's device and dtype, trainable.

    Raises:
        ValueError: a draft whose tokenizer or vocabulary differs from the target's (before any training).
    """
    if cfg.init == "target":
        draft = draft_from_target(target.model, cfg.num_layers)
    elif cfg.init == "scratch":
        config = copy.deepcopy(target.model.config)
        keep = draft_layer_indices(config, cfg.num_layers)
        config.num_hidden_layers = cfg.num_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = [config.layer_types[i] for i in keep]
        for key, value in cfg.config_overrides.items():
            if not hasattr(config, key):
                raise ValueError(f"draft.config_overrides: {type(config).__name__} has no field {key!r}")
            setattr(config, key, value)
        draft = type(target.model)(config).to(device=target.device, dtype=target.model.dtype)
    else:
        draft = load_draft_lm(cfg.path, target)
    draft.train()
    for p in draft.parameters():
        p.requires_grad_(True)
    return draft


def load_draft_lm(spec: str, target: FrozenTarget) -> Any:
    """A causal LM from a directory or Hub id, checked against `target` (tokenizer, vocabulary, and the
    target it was trained for when it is a draftsmith checkpoint), on the target's device, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model: Any = AutoModelForCausalLM.from_pretrained(spec, dtype=target.model.dtype)
    except OSError as err:
        raise FileNotFoundError(
            f"could not load draft model {spec!r}: {err}. Pass a local model directory or a reachable Hub id."
        ) from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError):
        tokenizer = None
    if tokenizer is not None and tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(target.tokenizer):
        raise ValueError(
            f"draft model {spec!r} has a different tokenizer from the target {target.name_or_path!r}: speculative "
            "decoding needs token ids that mean the same strings. Use a draft trained with the target's tokenizer."
        )
    if tokenizer is None:
        logger.warning(
            "draft model %s has no tokenizer files; assuming it shares the target's vocabulary", spec
        )
    vocab = model.get_output_embeddings().weight.shape[0]
    if vocab != target.vocab_size:
        raise ValueError(
            f"draft model {spec!r} has a {vocab}-token output layer, the target {target.vocab_size}: they must match"
        )
    metadata = Path(spec) / METADATA_NAME
    if metadata.is_file():
        check_target_identity(json.loads(metadata.read_text())["target"], target.identity(), f"draft {spec}")
    return model.to(target.device).eval()


def save_draft_lm(
    out: str | Path,
    model: Any,
    target: FrozenTarget,
    extra: dict[str, Any] | None = None,
    state_dict: dict[str, Any] | None = None,
) -> Path:
    """Write `model` as a transformers directory with the target's tokenizer and `draftsmith.json`
    (draftsmith version, the target's identity, `extra` such as the training summary). Atomic.
    `state_dict`: the weights gathered from a sharded engine, written instead of the model's own."""
    out = Path(out)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        target.tokenizer.save_pretrained(tmp)
        weights = sorted(p.name for p in tmp.glob("model*.safetensors"))
        metadata = {
            "draftsmith_version": draftsmith_version(),
            "kind": "draft_lm",
            "target": target.identity(),
            "weights_sha256": record_hashes(tmp, weights),
            **(extra or {}),
        }
        write_json(tmp / METADATA_NAME, metadata)
    return out
