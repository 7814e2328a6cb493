"""bench.acceptance_ideas: its arguments, read as the docstring says."""

import pytest

from bench.acceptance_ideas import parse_ideas, parse_sets, reference_target


def test_ideas_and_sets_are_parsed_and_bad_ones_refused():
    assert parse_ideas(["ttt5=draft.ttt_steps=5,draft.step_decay=1.0"]) == {
        "ttt5": ["draft.ttt_steps=5", "draft.step_decay=1.0"]
    }
    assert parse_sets(["gsm8k=data/g@x.jsonl@60"]) == {"gsm8k": ("data/g@x.jsonl", 60)}
    for bad in ("ttt5", "=draft.ttt_steps=5", "ttt5="):
        with pytest.raises(SystemExit, match="NAME=KEY=VALUE"):
            parse_ideas([bad])
    with pytest.raises(SystemExit, match="NAME=DATA@PROMPTS"):
        parse_sets(["gsm8k=data/g.jsonl"])


def test_the_reference_target_is_the_target_section_s_path(tmp_path):
    # a data path listed before the target's: the target section's own path is the one read
    (tmp_path / "config.yaml").write_text(
        "data:\n  cache:\n    path: runs/cache\ntarget:\n  path: /models/smollm2\n  revision: null\n"
    )
    assert reference_target(tmp_path) == "/models/smollm2"
