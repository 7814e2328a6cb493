"""Every drafter family is one complete record: each part it names exists (imported and of the right sort),
each part it lacks says why, every engine is either served by a layout or refused with a reason, and the rest
of draftsmith looks kinds up there (no second table keyed by kind)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from draftsmith.models.families import ENGINES, FAMILIES, family, train_methods

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "draftsmith"
PARTS = ("module", "config", "loss", "train_method", "drafter")


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_every_part_exists_or_says_why_not(kind):
    f = family(kind)
    assert f.kind == kind and f.title and f.tags
    for part in PARTS:
        if getattr(f, part) is None:
            assert f.why_not.get(part), f"{kind}: {part} is missing without a reason"
            with pytest.raises(ValueError, match=f"has no {part}"):
                f.resolve(part)
        elif part == "train_method":
            assert (SRC / "train" / f"{f.train_method}.py").is_file()
        else:
            assert callable(f.resolve(part)), (kind, part)
    if f.config is not None:
        assert dataclasses.is_dataclass(f.resolve("config"))
    if f.module is not None and isinstance(f.resolve("module"), type):
        assert issubclass(f.resolve("module"), torch.nn.Module)
        assert f.resolve("module").kind == kind  # what its checkpoints' config.json says
    for engine in ENGINES:
        assert f.serves(engine) or f.why_not.get(engine), f"{kind}: {engine} neither served nor refused"
        if f.serves(engine):
            assert callable(f.resolve(f"layout:{engine}"))
    assert set(f.layouts) <= set(ENGINES) and not set(f.layouts) & set(f.why_not)
    if f.served_target is not None:
        assert callable(f.resolve("served_target"))


def test_draft_lm_and_ngram_are_kinds_like_the_others():
    assert {"draft_lm", "ngram"} <= set(FAMILIES)
    methods = train_methods()
    expected = {
        "distill": ["draft_lm"],
        "eagle": ["eagle", "eagle3"],
        "medusa": ["medusa"],
        "mtp": ["mtp"],
        "dflash": ["dflash"],
    }
    assert {m: methods.get(m) for m in expected} == expected


def test_no_other_table_is_keyed_by_kind():
    """The consumers ask the families: no module outside models/families.py spells a dict of kinds."""
    literal = re.compile(r"\{\s*\(?\"(medusa|eagle3?|mtp|draft_lm|dflash|peagle)\"")
    offenders = []
    for folder in ("models", "train", "eval", "ship", "scripts", "data", "toy"):
        for path in (SRC / folder).rglob("*.py"):
            if path.name != "families.py" and literal.search(path.read_text()):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
