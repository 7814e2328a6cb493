"""A target's identity: the fingerprints a drafter records of the target it was trained for, and the check that
refuses to pair it with another (a different tokenizer, sizes, or a fine-tune of the same shapes)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the vocabulary (token -> id, added tokens included): equal iff ids mean the same strings."""
    return sha256_text(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False))


def weights_fingerprint(lm_head: torch.Tensor, final_norm: torch.Tensor | None) -> str:
    """sha256 of the final norm and 64 evenly spaced LM-head rows, rounded to bfloat16 (so a target loaded in
    float32 and in bfloat16 gives the same value): two models of the same shapes and tokenizer (a base model
    and its fine-tune) differ here, the same weights in another directory or under a Hub id do not."""
    rows = lm_head.detach()[:: max(1, lm_head.shape[0] // 64)]
    parts = [rows] + ([final_norm.detach()] if final_norm is not None else [])
    h = hashlib.sha256()
    for t in parts:
        h.update(t.to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def check_target_identity(expected: dict[str, Any], actual: dict[str, Any], what: str) -> None:
    """Refuse to pair a drafter with a target other than the one it was trained for.

    Sizes, the tokenizer and the weights' fingerprint (`weights_fingerprint`: tells a base model from its
    fine-tune) must match; a different path with all of them equal only logs a warning (the same weights in
    another directory or under a Hub id). Checkpoints written before the fingerprint existed are checked on
    the rest.

    Raises:
        ValueError: listing every mismatching field, with both values.
    """
    keys = ("vocab_size", "hidden_size", "num_layers", "tokenizer_sha256", "weights_sha256")
    bad = [k for k in keys if expected.get(k) is not None and expected.get(k) != actual.get(k)]
    if bad:
        lines = "; ".join(f"{k}: trained for {expected.get(k)!r}, got {actual.get(k)!r}" for k in bad)
        raise ValueError(
            f"{what} was trained for target {expected.get('name_or_path')!r} but is being paired with "
            f"{actual.get('name_or_path')!r}, which differs: {lines}. Use the drafter with the target it was "
            "trained for, or retrain it for this target."
        )
    if expected.get("chat_template_sha256") != actual.get("chat_template_sha256"):
        logger.warning("%s: the target's chat template differs from the one used in training", what)
    if expected.get("name_or_path") != actual.get("name_or_path"):
        logger.warning(
            "%s was trained for %r; pairing it with %r (same sizes and tokenizer)",
            what,
            expected.get("name_or_path"),
            actual.get("name_or_path"),
        )


def refuse_drafter_as_target(path: Path) -> None:
    """A draftsmith drafter checkpoint given where the target belongs: one line naming the target it was trained
    for (else the tokenizer load fails asking for a package a drafter never needed)."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return
    try:
        record = json.loads(config.read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and {"kind", "drafter", "target"} <= set(record):
        trained_for = (record.get("target") or {}).get("name_or_path")
        raise ValueError(
            f"{path} is a draftsmith drafter checkpoint (kind {record['kind']}), not a target model; pass the "
            f"target it was trained for ({trained_for})"
        )
