"""Which serving engines load which drafter kind for which target, from the family records
(models/families.py: `layouts`, `served_targets`, `layer_engines`, `serving_note`; docs/ENGINES.md in the
repository's words).

Training asks before its first step, so a user never trains for hours a drafter no engine can serve; export
refuses the same pairs with the same line. draftsmith's own evaluator runs every pair. `SUMMARY` (in error
messages) and `engine_table` (`draftsmith export --help`) are written from the records.
"""

from __future__ import annotations

from typing import Any

from .families import ENGINES, FAMILIES, family


def _served_by(kind: str) -> tuple[str, ...]:
    """The serving engines with a layout for `kind` (`hf` is the Hub's official layout, not an engine)."""
    return tuple(e for e in family(kind).layouts if e != "hf")


SUMMARY = "; ".join(
    f"{kind}: {', '.join(_served_by(kind))} ({f.serving_note or 'any target'})"
    for kind, f in FAMILIES.items()
    if _served_by(kind)
)


def model_type(target_config: Any) -> str:
    """The target's text model type (`qwen3_5_text` for Qwen3.5's text part)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    return str(getattr(text, "model_type", "") or getattr(target_config, "model_type", ""))


def serving_engines(kind: str, target_config: Any, draft_layer: str = "llama") -> tuple[str, ...]:
    """The engines that load a drafter of `kind` (with its `draft_layer`) for a target of `target_config`
    (empty: none)."""
    record = family(kind)  # unknown kinds raise, listing the known
    if draft_layer in record.layer_engines:
        return record.layer_engines[draft_layer]
    if record.served_targets is not None and model_type(target_config) not in record.resolve(
        "served_targets"
    ):
        return ()
    return _served_by(kind)


def unserved_reason(kind: str, target_config: Any) -> str | None:
    """One line saying that no engine serves `kind` for this target and which engines serve what; None when
    an engine serves it."""
    if serving_engines(kind, target_config):
        return None
    return f"no serving engine loads {kind} drafters for a {model_type(target_config)} target ({SUMMARY})"


def engine_table(indent: str = "    ") -> str:
    """Drafter kind -> the engines export writes it for (`--to`) and why the others are refused, one row per
    kind with a checkpoint to export."""
    rows = [f"{indent}{'drafter kind':<13} {'--to':<18} refused"]
    for kind, f in FAMILIES.items():
        if f.module is None:
            continue
        served = ", ".join(e for e in ENGINES if f.serves(e))
        notes = [f"{e}: {f.why_not[e]}" for e in ENGINES if not f.serves(e)] or ["-"]
        rows.append(f"{indent}{kind:<13} {served:<18} {notes[0]}")
        rows += [f"{indent}{'':<32} {note}" for note in notes[1:]]
        if f.serving_note:
            rows.append(f"{indent}{'':<13} ({f.serving_note})")
    return "\n".join(rows)
