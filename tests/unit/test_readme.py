"""The README states no figure that docs/BENCHMARKS.md does not hold, and its links into the docs land on a
file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A figure: a number with thousands separators or a decimal point (1,234 / 1.41), not part of a version
# (2.13.0) or of a longer word.
FIGURE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+\.\d+)(?![\w.]*\d)")
LINK = re.compile(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)")


def prose(markdown: str) -> str:
    """`markdown` without its fenced code blocks and inline code: commands, not claims."""
    without_blocks = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", without_blocks)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_figure_pattern_reads_figures_not_versions():
    text = "tau 1.601 against 1.290, 67,452 tokens, 1.41x plain; torch 2.13.0, EAGLE-3, 18 architectures"
    assert FIGURE.findall(text) == ["1.601", "1.290", "67,452", "1.41"]


def test_every_figure_in_the_readme_is_in_benchmarks():
    readme = prose((REPO / "README.md").read_text())
    benchmarks = (REPO / "docs" / "BENCHMARKS.md").read_text()
    figures = FIGURE.findall(readme)
    assert figures, "the README states no figure: the pattern or the README changed"
    held = set(FIGURE.findall(benchmarks))  # whole figures: 1.61 is not held by 1.611
    missing = sorted(set(figures) - held)
    assert missing == [], f"figures in README.md that docs/BENCHMARKS.md does not hold: {missing}"


def test_every_link_into_the_docs_lands_on_a_heading():
    readme = (REPO / "README.md").read_text()
    links = LINK.findall(readme)
    assert any(target for _, target in links), "the README links to no section of the docs"
    for path, target in links:
        doc = REPO / path
        assert doc.is_file(), f"README.md links to {path}, which does not exist"
        if target:
            headings = {anchor(line) for line in doc.read_text().splitlines() if line.startswith("#")}
            assert target in headings, f"README.md links to {path}#{target}: no such heading"
