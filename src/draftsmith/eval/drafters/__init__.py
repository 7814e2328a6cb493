"""Drafters the evaluator can run, and `load_drafter_spec` that turns a `--drafter` value into one.

ngram           prompt lookup, no model
self            the target drafting for itself (a sanity check: tau = depth + 1 at T=0 and T=1)
DIR             a draftsmith checkpoint (config.json with a "kind" of models/families.py), e.g. a run's final/
DIR or HUB_ID   any Hugging Face causal LM with the target's tokenizer (draft_lm)
ORG/NAME[@REV]  a drafter pushed with `draftsmith push` (downloaded, or read from the Hub cache offline)
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from draftsmith.models.checkpoint import TRAINER_STATE
from draftsmith.models.draft_lm import load_draft_lm
from draftsmith.models.families import FAMILIES, family
from draftsmith.models.target import FrozenTarget
from draftsmith.runtime.files import read_json, verify_hashes

from .base import Drafter
from .draft_lm import LMDrafter
from .ngram import NgramDrafter

# Every family's adapter class, by its class name (`EagleDrafter`, ...), imported when first asked for.
_ADAPTERS = {f.drafter.rpartition(":")[2]: f.drafter for f in FAMILIES.values()}
__all__ = ["Drafter", "load_drafter_spec", "served_target", *sorted(_ADAPTERS)]


def __getattr__(name: str) -> Any:
    if name not in _ADAPTERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = _ADAPTERS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def load_drafter_spec(
    spec: str, target: FrozenTarget, ngram_max: int = 3, ngram_min: int = 1, ngram_match: str = "latest"
) -> Drafter:
    """The drafter named by `spec` (see the module docstring), paired with `target` and on its device.

    Raises:
        FileNotFoundError / ValueError: with what was wrong and what to pass instead.
    """
    if spec == "ngram":
        return NgramDrafter(ngram_max, ngram_min, ngram_match)
    if spec == "self":
        return LMDrafter(target.model, name="self")
    path = Path(spec).expanduser()
    if not path.exists():
        path = resolve_hub_drafter(spec) or path
    config_file = path / "config.json"
    if (path / TRAINER_STATE).is_file() or (config_file.is_file() and "kind" in read_json(config_file)):
        return _draftsmith_checkpoint(path, target)  # a training checkpoint is refused there
    metadata = path / "draftsmith.json"
    if metadata.is_file():  # a distilled draft LM: its weights are checked against the hashes it recorded
        verify_hashes(path, read_json(metadata).get("weights_sha256"), str(metadata))
    if spec.startswith(("/", "./", "../", "~")) and not path.is_dir():
        raise FileNotFoundError(
            f"--drafter {spec!r} is not a directory; pass ngram, self, a draftsmith checkpoint directory "
            "(a training run's final/), or a Hugging Face causal LM directory / Hub id"
        )
    return LMDrafter(load_draft_lm(str(path) if path.is_dir() else spec, target), name="draft_lm")


def served_target(spec: str, target: FrozenTarget) -> FrozenTarget | None:
    """The target an engine serves beside the drafter `spec` when the drafter changes it (its family record's
    `served_target`: Medusa-2's adapter merged), or None when the target is served as it is."""
    config_file = Path(spec).expanduser() / "config.json"
    if not config_file.is_file() or (Path(spec).expanduser() / TRAINER_STATE).is_file():
        return None  # ngram, self, a plain causal LM; a training checkpoint is refused when it loads
    kind = read_json(config_file).get("kind")
    if kind is None or family(kind).served_target is None:
        return None
    served: FrozenTarget | None = family(kind).resolve("served_target")(target, Path(spec).expanduser())
    return served


HUB_REPO = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def resolve_hub_drafter(spec: str) -> Path | None:
    """The local snapshot of `ORG/NAME[@REVISION]` when that repository holds a draftsmith drafter (config.json
    with a "kind", or a draft LM's draftsmith.json), downloaded or taken from the Hub cache (HF_HUB_OFFLINE=1
    works); the `engines/` exports are not fetched. None for anything else (a plain Hub model id included)."""
    match = HUB_REPO.match(spec)
    if match is None:
        return None
    from huggingface_hub import snapshot_download

    repo, revision = match["repo"], match["revision"]
    try:
        probe = Path(
            snapshot_download(repo, revision=revision, allow_patterns=["config.json", "draftsmith.json"])
        )
    except (OSError, ValueError):  # unreachable, absent, or not cached: not ours to resolve
        return None
    config = probe / "config.json"
    ours = (probe / "draftsmith.json").is_file() or (config.is_file() and "kind" in read_json(config))
    if not ours:
        return None
    return Path(snapshot_download(repo, revision=revision, ignore_patterns=["engines/*"]))


def _draftsmith_checkpoint(path: Path, target: FrozenTarget) -> Drafter:
    from draftsmith.models.checkpoint import load_drafter

    model, config = load_drafter(path, target, device=target.device)
    adapter = family(config["kind"]).resolve("drafter")  # eval/drafters/<family>.py, from the family's record
    drafter: Drafter = adapter(model.to(target.model.dtype))
    return drafter
