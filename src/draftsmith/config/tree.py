"""What the config system reads off a dataclass tree: dotted keys, which annotations are sections, annotations
named for messages and `--help`, field defaults, and a config exported back to plain values. Shared by the
loader (loader.py), the command line (cli.py) and writing a config (save.py)."""

from __future__ import annotations

import dataclasses
import datetime
import types
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Literal, Union, get_args, get_origin


def join_key(prefix: str, name: str) -> str:
    """The dotted key of `name` inside section `prefix` (the top level when empty)."""
    return f"{prefix}.{name}" if prefix else name


def is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def section_type(tp: Any) -> type | None:
    """The dataclass behind ``tp`` if it is a section (``Cfg`` or ``Cfg | None``), else None."""
    if is_union(tp):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def type_name(tp: Any) -> str:
    """``tp`` as a person reads it: ``float``, ``int | None``, ``'a' | 'b'``, ``list[str]``."""
    if tp is Any:
        return "Any"
    if tp is type(None):
        return "None"
    origin, args = get_origin(tp), get_args(tp)
    if is_union(tp):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    return str(getattr(tp, "__name__", tp))


def default_of(f: dataclasses.Field[Any]) -> Any:
    """The field's default value (a fresh one from its factory), or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def export_tree(value: Any, key: str, plain: bool) -> Any:
    """Dataclasses -> dicts; with ``plain``, also Paths -> str and tuples -> lists (YAML-safe)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if f.init]  # derived fields are recomputed on load
        return {f.name: export_tree(getattr(value, f.name), join_key(key, f.name), plain) for f in fields}
    if isinstance(value, Mapping):
        return {k: export_tree(v, join_key(key, str(k)), plain) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [export_tree(v, f"{key}[{i}]", plain) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) and not plain else items
    if not plain:
        return value
    if isinstance(value, PurePath):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool, datetime.date)):
        return value
    raise TypeError(f"{key}: a {type(value).__name__} value cannot be written to a YAML config")
