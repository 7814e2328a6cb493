"""Writing a resolved config: plain YAML that `load_config` reads back to an equal object (what every run
directory and checkpoint stores)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from draftsmith.runtime.files import write_text

from .tree import export_tree


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config tree as plain YAML-safe types (Paths -> str, tuples -> lists), in field order."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"config_to_dict needs a dataclass instance, got {cfg!r}")
    out: dict[str, Any] = export_tree(cfg, "", plain=True)
    return out


def config_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (what checkpoints and run directories store)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False, allow_unicode=True)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write ``cfg`` as YAML that :func:`load_config` reads back to an equal object.

    The file is written to a temporary sibling and renamed, so a crash never leaves half a config next
    to a checkpoint.
    """
    write_text(Path(path), config_yaml(cfg))
