"""The draftsmith drafter checkpoint: a directory with `config.json` + `model.safetensors`.

config.json records the draftsmith version, the drafter kind and hyper-parameters, the target it was
trained for (see `FrozenTarget.identity`), the canonical feature layer ids, and the draft vocabulary size.
Weights are drafter weights only (never pickle, never the target's). Loading checks the target it is paired
with and refuses a mismatch. Writes are atomic: a temporary sibling directory renamed into place.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import (
    DamagedFile,
    atomic_dir,
    draftsmith_version,
    read_json,
    record_hashes,
    verify_hashes,
    write_json,
)

from .families import drafter_class, family
from .identity import check_target_identity
from .target import FrozenTarget

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINER_STATE = "trainer_state.json"  # marks a resumable training checkpoint (train/core/checkpointing.py)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file, or one line naming it when it is truncated or not safetensors at all."""
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise DamagedFile(
            f"{path} is not a readable safetensors file ({type(err).__name__}: {str(err)[:120]}); it is truncated "
            "or damaged: restore it, or export / train it again"
        ) from None


def save_drafter(
    out_dir: str | Path,
    model: nn.Module,
    target_identity: dict[str, Any],
    extra: dict[str, Any] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` (a registered drafter with a dataclass `config`) as a draftsmith checkpoint.

    Args:
        out_dir: destination directory (replaced atomically if it exists).
        model: the drafter; its class carries `kind` and `feature_layers`, its `config` the hyper-parameters.
        target_identity: `FrozenTarget.identity()` of the target it was trained for.
        extra: more JSON-safe entries for config.json (e.g. training summary).
        state_dict: the weights to write instead of `model.state_dict()` (gathered from a sharded engine).
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "draftsmith_version": draftsmith_version(),
        "format_version": FORMAT_VERSION,
        "kind": type(model).kind,  # type: ignore[attr-defined]
        "drafter": asdict(model.config),  # type: ignore[call-overload]
        "target": target_identity,
        "feature_layers": list(model.feature_layers),  # type: ignore[arg-type]
        "hidden_size": target_identity["hidden_size"],
        "draft_vocab_size": int(getattr(model, "draft_vocab_size", target_identity["vocab_size"])),
        **(model.extra_checkpoint_config() if hasattr(model, "extra_checkpoint_config") else {}),  # type: ignore[operator]
        **(extra or {}),
    }
    # Clone: safetensors refuses tensors that share storage, and a contiguous copy is what should ship.
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    with atomic_dir(out) as tmp:
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt", "kind": config["kind"]})
        config["weights_sha256"] = record_hashes(tmp, [WEIGHTS_NAME])
        write_json(tmp / CONFIG_NAME, config, sort_keys=True)
    return out


def read_drafter_config(ckpt_dir: str | Path) -> dict[str, Any]:
    """config.json of a draftsmith checkpoint, with a clear error if `ckpt_dir` is not one."""
    path = Path(ckpt_dir) / CONFIG_NAME
    if (Path(ckpt_dir) / TRAINER_STATE).is_file():
        raise UserError(
            f"{ckpt_dir} is a training checkpoint (continue it with --resume); a drafter is the run's final/ "
            f"directory: {Path(ckpt_dir).parent / 'final'}"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"{ckpt_dir} is not a draftsmith drafter checkpoint: {CONFIG_NAME} is missing "
            "(point at a training run's final/ directory)"
        )
    config = read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a draftsmith drafter config (a JSON object)")
    for key in ("kind", "drafter", "target"):
        if key not in config:
            raise ValueError(f"{path} has no {key!r} entry: not a draftsmith drafter checkpoint")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {config['format_version']}; this draftsmith reads up to "
            f"{FORMAT_VERSION}: upgrade draftsmith"
        )
    return config


def load_drafter(
    ckpt_dir: str | Path, target: FrozenTarget | None = None, device: torch.device | str = "cpu"
) -> tuple[Any, dict[str, Any]]:
    """Load a drafter checkpoint; when `target` is given, refuse it if it is not the training target.

    Returns:
        `(model in eval mode, config.json dict)`; the model's class is the kind's (models/families.py), known
        only from config.json, hence `Any`.
    """
    config = read_drafter_config(ckpt_dir)
    if target is not None:
        check_target_identity(config["target"], target.identity(), f"drafter {ckpt_dir}")
    cls = drafter_class(config["kind"])
    config_cls = family(config["kind"]).resolve("config")  # the recipe's `draft:` dataclass, from the record
    known = {f.name for f in fields(config_cls)}
    unknown = set(config["drafter"]) - known
    if unknown:
        raise ValueError(
            f"{ckpt_dir}: unknown {config['kind']} settings {sorted(unknown)} (newer draftsmith?)"
        )
    settings = config_cls(**config["drafter"])
    if hasattr(
        cls, "from_checkpoint_config"
    ):  # drafters built from more than sizes (e.g. the target's layers)
        model = cls.from_checkpoint_config(settings, config)
    else:
        model = cls(settings, config["hidden_size"], config["draft_vocab_size"])
    state = read_drafter_weights(ckpt_dir, config)
    missing, unexpected = (
        sorted(set(model.state_dict()) - set(state)),
        sorted(set(state) - set(model.state_dict())),
    )
    if missing or unexpected:
        raise UserError(
            f"{Path(ckpt_dir) / WEIGHTS_NAME} does not hold the weights of the {config['kind']} drafter its "
            f"config.json describes (missing {missing[:3]}, unexpected {unexpected[:3]}); the files come from "
            "different drafters"
        )
    model.load_state_dict(state, strict=True)
    if target is not None and hasattr(model, "attach_target"):  # frozen target parts are never saved
        model.attach_target(target.embed_tokens, target.head)
    return model.to(device).eval(), config


def read_drafter_weights(ckpt_dir: str | Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, after checking them against the sha256 its config.json records."""
    directory = Path(ckpt_dir)
    verify_hashes(directory, config.get("weights_sha256"), str(directory / CONFIG_NAME))
    return load_weights(directory / WEIGHTS_NAME)
