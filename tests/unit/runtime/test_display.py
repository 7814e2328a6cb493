"""runtime/display.py: table cells and Markdown tables, checked against hand-written text."""

from __future__ import annotations

from draftsmith.runtime.display import fmt_value, table


def test_values_are_formatted_for_a_table():
    assert fmt_value(None) == "-"
    assert fmt_value(1.23456) == "1.235" and fmt_value(1.23456, 1) == "1.2"
    assert fmt_value(3) == "3" and fmt_value(True) == "True" and fmt_value("x") == "x"


def test_a_markdown_table_by_hand():
    assert table(["drafter", "tau"], [("ngram", fmt_value(1.5)), ("eagle3", "-")]) == [
        "| drafter | tau |",
        "|---|---|",
        "| ngram | 1.500 |",
        "| eagle3 | - |",
    ]
    assert table(["a"], []) == ["| a |", "|---|"]
    assert table(["", "vLLM"], [("tau", "")]) == ["| | vLLM |", "|---|---|", "| tau | |"]  # empty cells
