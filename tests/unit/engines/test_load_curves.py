"""engine-eval's load curves without an engine: where speculation stops paying, the long prompts built from real
documents, and vLLM's Prometheus counters."""

from __future__ import annotations

import pytest

from draftsmith.engines.engine_report import curves_markdown
from draftsmith.engines.load_curves import QUESTION, long_prompts, parse_counters, stops_paying
from draftsmith.engines.settings import int_list
from draftsmith.runtime.errors import UserError


def rows(speedups: dict[int, float]) -> list[dict]:
    return [{"concurrency": c, "speedup": s} for c, s in speedups.items()]


@pytest.mark.parametrize(
    ("speedups", "expected"),
    [
        ({1: 2.1, 2: 1.6, 4: 1.1, 8: 0.77}, 8),  # the published DSpark drafter's shape
        ({1: 1.5, 2: 0.9, 4: 0.8, 8: 0.7}, 2),
        ({1: 1.2, 2: 0.95, 4: 1.05, 8: 1.01}, None),  # a dip that recovers is not where to switch off
        ({8: 0.5, 1: 0.9, 4: 0.6, 2: 0.7}, 1),  # any order in, increasing order used
        ({1: 1.0}, None),  # break-even still pays
    ],
)
def test_stops_paying_is_the_first_level_from_which_every_speedup_is_below_one(speedups, expected):
    assert stops_paying(rows(speedups), "concurrency") == expected


def test_the_curve_table_says_where_it_stops_paying():
    curve = [
        {
            "concurrency": c,
            "plain_tokens_per_s": p,
            "spec_tokens_per_s": s,
            "speedup": s / p,
            "mean_acceptance_length": 2.0,
        }
        for c, p, s in ((1, 40.0, 80.0), (8, 200.0, 150.0))
    ]
    text = "\n".join(curves_markdown({"concurrency": curve, "stops_paying": {"concurrency": 8}}))
    assert "| 1 | 40.0 | 80.0 | 2.00 | 2.00 |" in text and "| 8 | 200.0 | 150.0 | 0.75 | 2.00 |" in text
    assert "speculation stops paying at concurrency 8" in text
    never = {"concurrency": curve, "stops_paying": {"concurrency": 1}}
    assert "does not pay at any concurrency measured" in "\n".join(curves_markdown(never))
    always = {"concurrency": curve[:1], "stops_paying": {"concurrency": None}}
    assert "still pays at concurrency 1, the largest measured" in "\n".join(curves_markdown(always))


def test_long_prompts_are_real_documents_cut_to_length(toy_tokenizer):
    docs = [f"Document {k}. " + " ".join(f"word{k}_{i}" for i in range(400)) for k in range(3)]
    prompts = long_prompts(toy_tokenizer, docs, 300, 3)
    assert len(prompts) == 3
    for k, ids in enumerate(prompts):
        assert 290 <= len(ids) <= 300  # within a few tokens of the length, never over
        text = toy_tokenizer.decode(ids, skip_special_tokens=True)
        assert text.replace(" ", "").count(f"Document{k}.") == 1 and QUESTION.replace(
            " ", ""
        ) in text.replace(" ", "")
    with pytest.raises(UserError, match="pass more text with --context-data"):
        long_prompts(toy_tokenizer, docs[:1], 5000, 1)


def test_prometheus_counters_are_summed_over_label_sets():
    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 96.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 70.0
vllm:num_requests_running{engine="0"} 1.0
"""
    assert parse_counters(text) == {
        "vllm:spec_decode_num_drafts": 150.0,
        "vllm:spec_decode_num_accepted_tokens": 96.0,
    }


def test_level_lists_are_checked():
    assert int_list("8,1,2,2", "--concurrency") == [1, 2, 8]
    assert int_list(None, "--concurrency") == []
    with pytest.raises(UserError, match="expected comma-separated integers"):
        int_list("1,two", "--concurrency")
    with pytest.raises(UserError, match="must be >= 1"):
        int_list("0,4", "--context-lengths")
