"""The repeating / other split of two eval reports, on a hand-made pair of reports."""

import pytest

from bench.repeat_split import outside_vocab, split, table


def _report(rows: list[tuple[str, int, float, int, int]]) -> dict:
    return {
        "per_prompt": [
            {"id": i, "turn": t, "tau": tau, "new_tokens": n, "target_forwards": f}
            for i, t, tau, n, f in rows
        ]
    }


def test_answers_are_split_by_prompt_lookups_own_tau_and_pooled_per_part() -> None:
    ngram = _report([("a", 0, 4.0, 96, 24), ("a", 1, 1.2, 60, 50), ("b", 0, 2.0, 40, 20)])
    drafter = _report([("a", 0, 1.6, 96, 60), ("a", 1, 1.5, 60, 40), ("b", 0, 2.0, 40, 20)])
    parts = split(ngram, drafter, threshold=2.0)
    repeating, other = parts["repeating"], parts["other"]
    assert (repeating.answers, repeating.tokens, repeating.steps_ngram, repeating.steps_drafter) == (
        2,
        136,
        44,
        80,
    )
    assert repeating.tau_ngram == pytest.approx(136 / 44) and repeating.tau_drafter == pytest.approx(136 / 80)
    assert (other.answers, other.tokens, other.tau_ngram, other.tau_drafter) == (1, 60, 60 / 50, 60 / 40)
    text = table(parts)
    assert (
        "| repeating | 2 | 69% | 3.091 | 1.700 | 0.55x |" in text
        and "| other | 1 | 31% | 1.200 | 1.500 | 1.25x |" in text
    )


def test_reports_of_different_prompts_or_answers_are_refused() -> None:
    ngram = _report([("a", 0, 4.0, 96, 24)])
    with pytest.raises(ValueError, match="different prompts"):
        split(ngram, _report([("b", 0, 1.0, 96, 96)]), 2.0)
    with pytest.raises(ValueError, match="96 new tokens in one report, 95 in the other"):
        split(ngram, _report([("a", 0, 1.0, 95, 95)]), 2.0)


def test_the_share_outside_the_draft_vocabulary_is_counted_per_part() -> None:
    ngram = _report([("a", 0, 4.0, 3, 1), ("b", 0, 1.0, 2, 2)])
    in_vocab = [True, False, True, False]  # tokens 1 and 3 cannot be drafted
    shares = outside_vocab(ngram, [[0, 1, 1], [3, 2]], in_vocab, threshold=2.0)
    assert shares == {"repeating": pytest.approx(2 / 3), "other": pytest.approx(1 / 2)}
    with pytest.raises(ValueError, match="not the report's"):
        outside_vocab(ngram, [[0, 1], [3, 2]], in_vocab, threshold=2.0)  # the first answer is one token short
