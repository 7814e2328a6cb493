"""The built-in chat prompts: held out by subject, the same on every machine, read like any data source."""

from __future__ import annotations

from draftsmith.data import chat_prompts as cp
from draftsmith.data.conversations import prompt_turns, read_conversations


def _subject_of(prompt: str) -> str | None:
    """The subject a templated prompt was written from (None for a math problem, its own subject)."""
    for subjects, templates in cp.TEMPLATES.values():
        for subject in subjects:
            if any(t.format(subject) == prompt for t in templates):
                return subject
    return None


def test_no_held_out_prompt_shares_a_subject_with_a_training_prompt():
    train = [r["turns"][0] for r in cp.chat_prompts("train")]
    heldout = [r["turns"][0] for r in cp.chat_prompts("heldout")]
    assert not set(train) & set(heldout)
    train_subjects = {_subject_of(p) for p in train} - {None}
    heldout_subjects = {_subject_of(p) for p in heldout} - {None}
    assert heldout_subjects and not train_subjects & heldout_subjects
    # every template of a subject lands on the subject's side
    for subject in heldout_subjects:
        assert all(_subject_of(p) != subject for p in train)
    assert len(train) + len(heldout) == len(cp.chat_prompts("all"))


def test_every_category_is_in_both_splits_and_the_order_is_fixed():
    for split in ("train", "heldout"):
        rows = cp.chat_prompts(split)
        assert {r["category"] for r in rows} == {*cp.TEMPLATES, "math"}
        assert len({r["turns"][0] for r in rows}) == len(rows)  # no prompt twice
    # the same prompts in the same order on every machine (a seeded shuffle, a stable hash): pinned
    assert len(cp.chat_prompts("train")) == 891 and len(cp.chat_prompts("heldout")) == 134
    assert cp.chat_prompts("heldout")[0]["turns"] == [
        "Name three ways to be more productive and describe each in one sentence."
    ]


def test_subjects_are_single_lines_without_padding():
    for subjects, _ in cp.TEMPLATES.values():
        for s in subjects:
            assert s == " ".join(s.split()) and s


def test_read_as_a_data_source():
    convs = read_conversations("prompts:heldout", limit=5)
    assert len(convs) == 5
    assert [prompt_turns(c)[0][-1]["content"] for c in convs] == [
        r["turns"][0] for r in cp.chat_prompts("heldout")[:5]
    ]
    assert all(m["role"] == "user" for c in convs for m in c.messages)
