"""Drafters the evaluator can run, and `load_drafter_spec` that turns a `--drafter` value into one.

ngram           prompt lookup, no model
self            the target drafting for itself (a sanity check: tau = depth + 1 at T=0 and T=1)
DIR             a draftsmith checkpoint (config.json with "kind"), e.g. a training run's final/
DIR or HUB_ID   any Hugging Face causal LM with the target's tokenizer (draft_lm)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from draftsmith.models.target import FrozenTarget, tokenizer_fingerprint

from .base import Drafter
from .draft_lm import LMDrafter
from .eagle import EagleDrafter
from .medusa import MedusaDrafter
from .ngram import NgramDrafter

logger = logging.getLogger(__name__)

__all__ = ["Drafter", "EagleDrafter", "LMDrafter", "MedusaDrafter", "NgramDrafter", "load_drafter_spec"]


def load_drafter_spec(spec: str, target: FrozenTarget, ngram_max: int = 3, ngram_min: int = 1) -> Drafter:
    """The drafter named by `spec` (see the module docstring), paired with `target` and on its device.

    Raises:
        FileNotFoundError / ValueError: with what was wrong and what to pass instead.
    """
    if spec == "ngram":
        return NgramDrafter(ngram_max, ngram_min)
    if spec == "self":
        return LMDrafter(target.model, name="self")
    path = Path(spec).expanduser()
    config_file = path / "config.json"
    if config_file.is_file() and "kind" in json.loads(config_file.read_text()):
        return _draftsmith_checkpoint(path, target)
    if spec.startswith(("/", "./", "../", "~")) and not path.is_dir():
        raise FileNotFoundError(
            f"--drafter {spec!r} is not a directory; pass ngram, self, a draftsmith checkpoint directory "
            "(a training run's final/), or a Hugging Face causal LM directory / Hub id"
        )
    return LMDrafter(_load_causal_lm(spec, target), name="draft_lm")


def _draftsmith_checkpoint(path: Path, target: FrozenTarget) -> Drafter:
    from draftsmith.models.checkpoint import load_drafter

    model, config = load_drafter(path, target, device=target.device)
    model = model.to(target.model.dtype)
    if config["kind"] == "medusa":
        return MedusaDrafter(model)
    if config["kind"] in ("eagle", "eagle3"):
        return EagleDrafter(model)
    raise ValueError(
        f"{path}: drafter kind {config['kind']!r} has no evaluator support in this draftsmith version"
    )


def _load_causal_lm(spec: str, target: FrozenTarget) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=target.model.dtype)
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
    return model.to(target.device).eval()
