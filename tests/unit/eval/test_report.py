"""The report's tau standard error, pooled and per-answer tau and tau per category, against hand computations
and their invariants."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.conversations import read_conversations
from draftsmith.eval.decoder import Generation, Step
from draftsmith.eval.report import TurnResult, by_context, markdown, summarize, tau_per_request, tau_stderr


def gen(committed: list[int]) -> Generation:
    steps = [
        Step(draft_tokens=4, depth=4, accepted=c - 1, committed=c, cache_len=0, draft_s=0, verify_s=0)
        for c in committed
    ]
    return Generation(tokens=[0] * (sum(committed) + 1), steps=steps)


def test_tau_stderr_by_hand():
    # answers: 6 tokens / 2 steps and 2 tokens / 2 steps -> tau = 8 / 4 = 2; residuals c - 2n = +2, -2;
    # SE = sqrt(2 / 1 * (4 + 4)) / 4 = 1.0
    assert tau_stderr([gen([3, 3]), gen([1, 1])]) == pytest.approx(1.0)


def test_tau_stderr_is_zero_when_every_answer_has_the_same_tau_and_undefined_for_one():
    assert tau_stderr([gen([2, 4]), gen([3]), gen([1, 5, 3])]) == pytest.approx(0.0)
    assert tau_stderr([gen([2, 4])]) is None


def test_tau_stderr_shrinks_like_one_over_sqrt_answers():
    few = tau_stderr([gen([3, 3]), gen([1, 1])] * 4)
    many = tau_stderr([gen([3, 3]), gen([1, 1])] * 16)
    assert few is not None and many is not None
    assert many == pytest.approx(few / 2, rel=0.05)


def test_pooled_and_per_answer_tau_by_hand_and_by_category():
    # A: one step of 4 tokens (tau 4); B: three steps of 1 (tau 1); C: two steps of 2 and 3 (tau 2.5).
    # Pooled: (4 + 3 + 5) / (1 + 3 + 2) = 2.0; per answer: (4 + 1 + 2.5) / 3 = 2.5.
    a, b, c = gen([4]), gen([1, 1, 1]), gen([2, 3])
    turns = [
        TurnResult("a", 0, 5, a, category="math"),
        TurnResult("b", 0, 5, b, category="writing"),
        TurnResult("c", 0, 5, c, category="math"),
        TurnResult("d", 0, 5, Generation(tokens=[0]), category=None),  # stopped at the prefill: no step
    ]
    report = summarize(turns)
    assert report["tau"] == pytest.approx(2.0) and report["tau_per_request"] == pytest.approx(2.5)
    assert report["by_category"] == {
        "math": {"answers": 2, "tau": pytest.approx(9 / 3), "tau_per_request": pytest.approx(3.25)},
        "writing": {"answers": 1, "tau": pytest.approx(1.0), "tau_per_request": pytest.approx(1.0)},
    }
    # The ranking of two drafters can flip between the two: X wins pooled, Y per answer.
    x = [gen([2] * 10), gen([1])]  # pooled 21 / 11 = 1.91, per answer (2 + 1) / 2 = 1.5
    y = [gen([1] * 10), gen([5])]  # pooled 15 / 11 = 1.36, per answer (1 + 5) / 2 = 3.0
    assert (tau_per_request(x) or 0) < (tau_per_request(y) or 0)
    sx, sy = (
        summarize([TurnResult("x", k, 1, g) for k, g in enumerate(x)]),
        summarize([TurnResult("y", k, 1, g) for k, g in enumerate(y)]),
    )
    assert sx["tau"] > sy["tau"] and sx["by_category"] == {}


def test_categories_are_read_from_records_and_shown_in_the_table(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"turns": ["Write a poem."], "category": "writing"},
        {"turns": ["2+2?"], "category": ["not", "a", "string"]},  # a field of another shape: ignored
        {"turns": ["Hi."]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [c.category for c in read_conversations(str(path), "auto", None)] == ["writing", None, None]
    report = {
        **summarize([TurnResult("a", 0, 5, gen([3, 1]), category="writing")]),
        "settings": {"drafter": "d", "tree": "chain", "depth": 4, "temperature": 0, "top_p": 1, "top_k": 0},
        "num_prompts": 1,
        "num_turns": 1,
        "lossless": True,
    }
    table = markdown(report)
    assert "| tau, mean per answer (SpecForge's) | 2.000 |" in table
    assert "| writing | 1 | 2.000 | 2.000 |" in table


def test_tau_and_alpha_by_context_length_bucket_by_hand():
    def step(cache_len: int, committed: int) -> Step:
        return Step(4, 4, committed - 1, committed, cache_len, 0, 0)

    # contexts (cache + 1): 100 and 512 -> "1-512"; 513 and 900 -> "513-1024"; 300,000 -> ">262144"
    g1 = Generation(tokens=[0] * 9, steps=[step(99, 3), step(511, 1), step(512, 2)])
    g2 = Generation(tokens=[0] * 9, steps=[step(899, 4), step(299_999, 5)])
    rows = by_context([g1, g2])
    assert [(r["context"], r["steps"]) for r in rows] == [("1-512", 2), ("513-1024", 2), (">262144", 1)]
    assert [r["tau"] for r in rows] == [pytest.approx(2.0), pytest.approx(3.0), pytest.approx(5.0)]
    assert [r["alpha"] for r in rows] == [pytest.approx(2 / 8), pytest.approx(4 / 8), pytest.approx(4 / 4)]
    # The buckets partition the steps: their step-weighted tau is the pooled tau.
    report = summarize([TurnResult("a", 0, 90, g1), TurnResult("b", 0, 90, g2)])
    pooled = sum(r["tau"] * r["steps"] for r in report["by_context"]) / sum(r["steps"] for r in rows)
    assert report["tau"] == pytest.approx(pooled) == pytest.approx(15 / 5)
    settings = {"drafter": "d", "tree": "chain", "depth": 4, "temperature": 0, "top_p": 1, "top_k": 0}
    table = markdown({**report, "settings": settings, "num_prompts": 2, "num_turns": 2, "lossless": None})
    assert "| context tokens | steps | tau | alpha |" in table and "| 513-1024 | 2 | 3.000 | 0.500 |" in table
