"""Drafter registry: a plain dict from a short kind name to its `nn.Module` class.

Adding a drafter is a new file in models/ plus `@register_drafter("kind")`; there is no auto-discovery,
so `drafter_class` imports the built-in modules explicitly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_DRAFTERS: dict[str, type] = {}
_BUILTIN_MODULES = {  # kind -> module that registers it
    "medusa": "draftsmith.models.medusa",
    "eagle": "draftsmith.models.eagle",
    "eagle3": "draftsmith.models.eagle3",
    "mtp": "draftsmith.models.mtp",
}


def register_drafter(kind: str) -> Callable[[type[T]], type[T]]:
    """Class decorator registering a drafter under `kind`; a duplicate name raises ValueError."""

    def decorator(cls: type[T]) -> type[T]:
        if kind in _DRAFTERS and _DRAFTERS[kind] is not cls:
            raise ValueError(f"drafter kind {kind!r} is already registered by {_DRAFTERS[kind].__qualname__}")
        _DRAFTERS[kind] = cls
        cls.kind = kind  # type: ignore[attr-defined]
        return cls

    return decorator


def drafter_class(kind: str) -> type:
    """The class registered under `kind`; an unknown kind lists the known ones."""
    if kind not in _DRAFTERS and kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    if kind not in _DRAFTERS:
        known = sorted(set(_DRAFTERS) | set(_BUILTIN_MODULES))
        raise ValueError(f"unknown drafter kind {kind!r}; known kinds: {', '.join(known)}")
    return _DRAFTERS[kind]
