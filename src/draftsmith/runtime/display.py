"""What a command shows a person: values formatted for a table, Markdown tables, and matplotlib loaded for a
plot. Every report, card and benchmark table in draftsmith is built with these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt_value(value: Any, digits: int = 3) -> str:
    """A value for a Markdown table: "-" for none, floats to `digits` places."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table (cells as `str` gives them: format numbers with `fmt_value` first; an
    empty cell is written `| |`)."""
    return [_row(header), "|" + "---|" * len(header), *(_row(row) for row in rows)]


def _row(cells: Sequence[Any]) -> str:
    return "|" + "|".join(f" {text} " if (text := str(v)) else " " for v in cells) + "|"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; one line naming the install when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError("--plot needs matplotlib: pip install 'draftsmith[plot]' (or matplotlib)") from err
    return plt
