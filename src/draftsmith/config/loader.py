"""Strict nested-dataclass configs: a YAML recipe plus ``a.b=c`` overrides -> one typed config tree.

Every training method describes its settings as one tree of ``@dataclass`` es whose fields carry
``field(..., metadata={"help": "..."})``. A run's config resolves as *class defaults < YAML file <
command-line overrides* and is converted strictly: an unknown key, a wrong type or a missing required
field raises :class:`ConfigError` naming the dotted key (``train.lr``), so a typo never silently trains
with a default. ``save_config`` writes the resolved tree back as YAML that ``load_config`` reads to an
equal object.

Override semantics: ``train.lr=3e-4`` sets one key (creating the ``train`` section if the file has none);
the value is parsed as YAML, so a mapping or list value (``data.paths=[a, b]``) *replaces* the whole
value at that key. ``a.b=`` is the empty string and ``a.b=null`` is None.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from .tree import default_of, export_tree, is_union, join_key, section_type, type_name

T = TypeVar("T")

# PyYAML implements YAML 1.1, whose float pattern needs a dot, so ``lr: 3e-4`` arrives as the string
# "3e-4". Every user means a number, so float fields accept strings of exactly this form (not "fast").
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_EXAMPLE = "train.lr=3e-4"


class ConfigError(ValueError):
    """A mistake in a config file or override; the message names the dotted key and what was expected."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys, which PyYAML would otherwise resolve silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may legitimately repeat keys
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str):  # config keys are strings; other keys fail later as unknown keys
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


@dataclasses.dataclass(frozen=True)
class _CliScalar:
    """An override's YAML-parsed scalar plus the text as typed.

    ``revision=1234`` parses as an int; a ``str`` field should get "1234", not a type error, so
    conversion falls back to the text when the parsed value does not fit the field.
    """

    value: Any
    text: str


class _Sources(dict[str, str]):
    """Which override set which dotted key (in order), so errors can say where a bad value came from."""

    def __init__(self, default: str) -> None:
        super().__init__()
        self.default = default

    def of(self, key: str) -> str:
        for set_key in reversed(self):  # the latest override touching `key` (or a parent/child) wins
            if _within(set_key, key) or _within(key, set_key):
                return self[set_key]
        return self.default


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith((outer + ".", outer + "["))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _short(value: Any) -> str:
    text = repr(_plain(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _plain(value: Any) -> Any:
    """Strip override wrappers (for ``Any`` fields and messages)."""
    if isinstance(value, _CliScalar):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read_yaml(path: Path) -> dict[Any, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from e
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {_one_line(str(e))}") from e
    if data is None:  # an empty recipe means "all defaults"
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a config file must be a YAML mapping of keys to values, got {type(data).__name__}"
        )
    return data


def _apply_overrides(tree: dict[Any, Any], overrides: Sequence[str], sources: _Sources) -> None:
    if isinstance(overrides, str):  # a lone string would be applied character by character
        raise TypeError(f"overrides must be a sequence of KEY=VALUE strings, got the string {overrides!r}")
    for item in overrides:
        _apply_override(tree, item, sources)


def _apply_override(tree: dict[Any, Any], item: str, sources: _Sources) -> None:
    """Set one ``dotted.key=value`` in the raw tree, creating sections on the way."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(f"bad override {item!r}: expected KEY=VALUE with a dotted key, e.g. {_EXAMPLE}")
    value: Any = ""  # `a.b=` is the empty string, not YAML's null
    if text.strip():
        try:
            value = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {_one_line(str(e))}") from e
        if value is not None and not isinstance(value, (str, list, dict)):
            value = _CliScalar(value, text.strip())
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"override {item!r}: '{where}' is {_short(child)} ({type(_plain(child)).__name__}), "
                f"not a section, so it has no key '{parts[depth + 1]}'"
            )
        node = child
    node[parts[-1]] = value
    sources.pop(key.strip(), None)  # re-insert so that the latest override is found first
    sources[key.strip()] = f"override {item!r}"


def _type_error(key: str, expected: str, value: Any, sources: _Sources) -> ConfigError:
    got = f"{_short(value)} ({type(_plain(value)).__name__})"
    return ConfigError(f"{key}: expected {expected}, got {got} (from {sources.of(key)})")


# Top-level recipe sections renamed since draftsmith 0.1: refused with a pointer to the new name.
RENAMED = {"model": "draft"}


def _build(cls: type[T], raw: Mapping[Any, Any], key: str, sources: _Sources, base: Any = None) -> T:
    """Build dataclass ``cls`` at dotted path ``key`` from a raw mapping.

    Keys missing from ``raw`` come from ``base`` (the field's default instance) when given, so a partial
    section keeps the values of a ``default_factory`` that differs from the class defaults.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    for name in raw:
        if name not in fields and not key and RENAMED.get(str(name)) in fields:
            new = RENAMED[str(name)]
            raise ConfigError(
                f"the recipe section '{name}' is now '{new}' (from {sources.of(str(name))}): every drafter's "
                f"hyper-parameters live under '{new}:'; rename '{name}:' in the YAML and '{name}.KEY=...' "
                f"overrides to '{new}.KEY=...'"
            )
        if name not in fields:
            dotted, valid = join_key(key, str(name)), sorted(fields)
            section = f"section '{key}'" if key else "the top level"
            msg = f"unknown key '{dotted}' (from {sources.of(dotted)}); valid keys in {section}: {', '.join(valid)}"
            close = difflib.get_close_matches(str(name), valid, n=1)
            raise ConfigError(msg + (f"; did you mean '{join_key(key, close[0])}'?" if close else ""))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        dotted, tp = join_key(key, name), hints[name]
        if name in raw:
            sub_base = None
            if section_type(tp) is not None:
                sub_base = getattr(base, name) if base is not None else default_of(f)
            kwargs[name] = _convert(tp, raw[name], dotted, sources, sub_base)
        elif base is not None:
            kwargs[name] = copy.deepcopy(getattr(base, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            help_text = _one_line(f.metadata.get("help", ""))
            raise ConfigError(
                f"missing required key '{dotted}' ({type_name(tp)})" + (f": {help_text}" if help_text else "")
            )
    try:
        return cls(**kwargs)
    except ValueError as e:  # a __post_init__ cross-field check: say which section failed
        raise ConfigError(f"{key or cls.__name__}: {_one_line(str(e))}") from e


def _convert(tp: Any, value: Any, key: str, sources: _Sources, base: Any = None) -> Any:
    """Convert one raw value to annotation ``tp`` or raise a ConfigError naming ``key``."""
    if isinstance(value, _CliScalar):
        return _convert_typed(tp, value, key, sources)
    if tp is Any or tp is object:
        return _plain(value)
    origin = get_origin(tp)
    if is_union(tp):
        return _convert_union(tp, value, key, sources, base)
    if origin is Literal:
        return _convert_literal(tp, value, key, sources)
    section = section_type(tp)
    if section is not None:
        return _convert_section(section, value, key, sources, base)
    if origin in (list, tuple) or tp in (list, tuple):
        return _convert_sequence(tp, value, key, sources)
    if origin is dict or tp is dict:
        return _convert_mapping(tp, value, key, sources)
    return _convert_scalar(tp, value, key, sources)


def _convert_typed(tp: Any, value: _CliScalar, key: str, sources: _Sources) -> Any:
    """An override's value as YAML parsed it, else as typed (``revision=1234`` for a ``str`` field); the
    parsed value's error when neither fits."""
    try:
        return _convert(tp, value.value, key, sources)
    except ConfigError as first:
        try:
            return _convert(tp, value.text, key, sources)
        except ConfigError:
            raise first from None


def _convert_union(tp: Any, value: Any, key: str, sources: _Sources, base: Any) -> Any:
    """None for an optional annotation, else the first option ``value`` converts to."""
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:  # Optional[X]: X's own, more precise error
        return _convert(options[0], value, key, sources, base)
    for option in options:
        try:
            return _convert(option, value, key, sources, base)
        except ConfigError:
            continue
    raise _type_error(key, type_name(tp), value, sources)


def _convert_literal(tp: Any, value: Any, key: str, sources: _Sources) -> Any:
    """One of the literal's values (of the same type: ``1`` is not ``True``), with a "did you mean" hint."""
    args = get_args(tp)
    if any(type(value) is type(a) and value == a for a in args):
        return value
    err = _type_error(key, "one of " + ", ".join(repr(a) for a in args), value, sources)
    close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
    raise ConfigError(str(err) + (f"; did you mean {close[0]!r}?" if close else "")) from None


def _convert_section(section: type, value: Any, key: str, sources: _Sources, base: Any) -> Any:
    """A nested section built from a mapping (keys it leaves out come from ``base``, its default instance)."""
    if not isinstance(value, Mapping):
        raise _type_error(key, f"a mapping for section {section.__name__}", value, sources)
    return _build(section, value, key, sources, base if isinstance(base, section) else None)


def _convert_mapping(tp: Any, value: Any, key: str, sources: _Sources) -> dict[Any, Any]:
    """A ``dict[K, V]`` with every key and value converted."""
    if not isinstance(value, Mapping):
        raise _type_error(key, type_name(tp), value, sources)
    key_tp, val_tp = get_args(tp) or (Any, Any)
    return {
        _convert(key_tp, k, f"{key} (key {k!r})", sources): _convert(
            val_tp, v, join_key(key, str(k)), sources
        )
        for k, v in value.items()
    }


def _convert_sequence(tp: Any, value: Any, key: str, sources: _Sources) -> list[Any] | tuple[Any, ...]:
    container, args = get_origin(tp) or tp, get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _type_error(key, f"a list ({type_name(tp)})", value, sources)
    if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):  # tuple[A, B]
        if len(value) != len(args):
            raise _type_error(key, f"{len(args)} items ({type_name(tp)})", value, sources)
        return tuple(
            _convert(a, v, f"{key}[{i}]", sources) for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    item_tp = args[0] if args else Any
    items = [_convert(item_tp, v, f"{key}[{i}]", sources) for i, v in enumerate(value)]
    return tuple(items) if container is tuple else items


def _convert_scalar(tp: Any, value: Any, key: str, sources: _Sources) -> Any:
    """A value of a plain class: bool, int, float, str, a path or any other class, strictly."""
    if not isinstance(tp, type):
        raise TypeError(f"{key}: unsupported config annotation {tp!r}")
    if issubclass(tp, PurePath):
        if isinstance(value, (str, PurePath)) and str(value):
            return tp(value)
        raise _type_error(key, f"a non-empty path ({tp.__name__})", value, sources)
    converted = _scalar_as(tp, value)
    if converted is _MISFIT:
        raise _type_error(key, type_name(tp), value, sources)
    return converted


_MISFIT = object()  # what _scalar_as returns for a value that is not of the class


def _scalar_as(tp: type, value: Any) -> Any:
    """``value`` as a ``tp``: itself when it is one; for a float field also an int or a number string
    (``"3e-4"``); ``_MISFIT`` otherwise. Only real booleans are bools: 0/1 or "yes" strings for a flag are
    more likely mistakes, and a bool is no int."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if tp is int:
        return value if is_int else _MISFIT
    if tp is float and not isinstance(value, float):
        number_text = isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip())
        return float(value) if is_int or number_text else _MISFIT
    return value if isinstance(value, tp) else _MISFIT


def recipe_path(path: str | Path) -> Path:
    """`path` itself when it exists; else, for `recipes/...`, the recipe of that name that ships inside
    draftsmith, so `--config recipes/medusa/toy.yaml` works from any directory once draftsmith is installed."""
    path = Path(path)
    if path.exists() or path.is_absolute() or path.parts[:1] != ("recipes",):
        return path
    shipped = Path(str(files("draftsmith"))) / path
    return shipped if shipped.is_file() else path


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Resolve a config: ``cls`` defaults, then the YAML file at ``path``, then ``overrides``.

    Args:
        cls: The root dataclass of the method's config tree.
        path: Optional YAML recipe whose nesting mirrors ``cls``.
        overrides: ``dotted.key=value`` strings; values are parsed as YAML. Later ones win.

    Returns:
        A ``cls`` instance with every nested section built and its ``__post_init__`` run.

    Raises:
        ConfigError: Unreadable or non-mapping YAML, malformed override, unknown key, wrong type, missing
            required key, or a failed ``__post_init__`` check. The message names the dotted key.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    path = recipe_path(path) if path is not None else None
    sources = _Sources(f"file {path}" if path is not None else "defaults")
    tree = _read_yaml(path) if path is not None else {}
    _apply_overrides(tree, overrides, sources)
    return _build(cls, tree, "", sources)


def override_config(cfg: T, overrides: Sequence[str]) -> T:
    """Return a new config equal to ``cfg`` with ``dotted.key=value`` overrides applied, strictly.

    Raises:
        ConfigError: As for :func:`load_config`; ``__post_init__`` checks run again on the result.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"override_config needs a dataclass instance, got {cfg!r}")
    sources = _Sources("the config being overridden")
    tree = export_tree(cfg, "", plain=False)
    _apply_overrides(tree, overrides, sources)
    return _build(type(cfg), tree, "", sources)
