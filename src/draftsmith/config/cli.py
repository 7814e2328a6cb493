"""Command-line side of the configs: ``--config FILE`` plus ``KEY=VALUE`` overrides, keys listed in ``--help``."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, get_type_hints

from .loader import _EXAMPLE, ConfigError, _one_line, load_config
from .tree import default_of, export_tree, join_key, section_type, type_name

T = TypeVar("T")


def _show_default(value: Any) -> str:
    try:
        return repr(export_tree(value, "", plain=True))
    except TypeError:
        return repr(value)


def _help_lines(cls: type, prefix: str, base: Any) -> Iterator[str]:
    """Help lines for section ``cls``; defaults are read from ``base`` (the section's default instance)
    when given, because a parent's ``default_factory`` may set values other than the class defaults."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp, section = join_key(prefix, f.name), hints[f.name], section_type(hints[f.name])
        default = getattr(base, f.name) if base is not None else default_of(f)
        if section is not None and section is tp:  # a plain section: its keys speak for it
            yield from _help_lines(section, key, default)
            continue
        required = base is None and f.default is f.default_factory is dataclasses.MISSING
        shown = "required" if required else f"default {_show_default(default)}"
        help_text = _one_line(f.metadata.get("help", ""))
        yield f"  {key} ({type_name(tp)}, {shown})" + (f": {help_text}" if help_text else "")
        if section is not None:  # an optional section can still be filled key by key
            yield from _help_lines(section, key, default if isinstance(default, section) else None)


def config_help(cls: type) -> str:
    """One line per dotted key, ``  train.lr (float, default 0.001): help``, for ``--help`` epilogs."""
    return "\n".join(_help_lines(cls, "", None))


def make_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser taking ``--config FILE`` and ``KEY=VALUE`` overrides, keys listed in the epilog.

    Callers may add their own flags (e.g. ``--resume``) before calling :func:`parse_args`.
    """
    epilog = (
        "config keys (set with KEY=VALUE; the command line wins over --config, which wins over defaults):\n"
        + config_help(cls)
    )
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", metavar="FILE", default=None, help="YAML recipe mirroring the config tree"
    )
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="KEY=VALUE", help=f"dotted overrides, e.g. {_EXAMPLE}"
    )
    return parser


def parse_args(
    cls: type[T], parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> tuple[T, argparse.Namespace]:
    """Parse ``argv`` (default ``sys.argv[1:]``) with ``parser`` and resolve the config.

    Overrides and flags may be interleaved (``a.b=1 --resume x c.d=2``). A config mistake exits through
    ``parser.error``: a one-line message and status 2, never a traceback.
    """
    args = parser.parse_intermixed_args(None if argv is None else list(argv))
    try:
        cfg = load_config(cls, args.config, args.overrides or ())
    except ConfigError as e:
        parser.error(_one_line(str(e)))
    return cfg, args
