"""Tool-call and reasoning spans of answers, and tau on each, against hand-marked text and hand-computed steps."""

from __future__ import annotations

import json

import pytest

from draftsmith.eval.decoder import Generation, Step
from draftsmith.eval.report import TurnResult, markdown, summarize
from draftsmith.eval.spans import by_span, char_spans, token_spans


def marked(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` with its spans marked by « and »: the plain text and the spans' character ranges."""
    plain, spans, start = "", [], 0
    for ch in text:
        if ch == "«":
            start = len(plain)
        elif ch == "»":
            spans.append((start, len(plain)))
        else:
            plain += ch
    return plain, spans


@pytest.mark.parametrize(
    "text",
    [
        'Let me look. «<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>» Done.',
        "Sure «<|python_tag|>f.call(x=1)<|eom_id|>»then",
        "ok «[TOOL_CALLS][{'name': 'f'}] and the rest»",
        'I will call «{"name": "search", "arguments": {"q": "a {b}"}}» and «{"name": "g", "parameters": {}}».',
        'Two: «<tool_call>{"name": "f", "arguments": {}}</tool_call>»«<tool_call>{"name": "g"»',  # unclosed
        'No call: {"name": "not a call"} and {"name": "x", "arguments": 1',  # no arguments / broken JSON
    ],
)
def test_tool_call_spans_by_hand(text):
    plain, expected = marked(text)
    assert sorted(char_spans(plain, "tool_call")) == expected


@pytest.mark.parametrize(
    "text",
    [
        "«<think>\nfirst this, then that\n</think>»\n\nThe answer is 4.",
        "«<|channel|>analysis<|message|>think<|end|>»<|start|>assistant<|channel|>final<|message|>4",
        "Answer first. «<think>never closed»",
    ],
)
def test_reasoning_spans_by_hand(text):
    plain, expected = marked(text)
    assert char_spans(plain, "reasoning") == expected


def test_token_spans_follow_the_pieces_and_see_a_think_the_prompt_opened(toy_tokenizer):
    enc = toy_tokenizer.encode
    pieces = [
        ("prose", enc("Here it is: ", add_special_tokens=False)),
        ("call", enc('<tool_call>{"name": "f", "arguments": {}}</tool_call>', add_special_tokens=False)),
        ("prose", enc(" done", add_special_tokens=False)),
    ]
    tokens = [t for _, ids in pieces for t in ids]
    inside = [kind == "call" for kind, ids in pieces for _ in ids]
    spans = token_spans(toy_tokenizer, enc("user: hi\nassistant:", add_special_tokens=False), tokens)
    assert spans["tool_call"] == inside and not any(spans["reasoning"])

    thinking, answer = (
        enc("step one\n</think>", add_special_tokens=False),
        enc(" four", add_special_tokens=False),
    )
    prompt = enc("user: 2+2?\nassistant: <think>", add_special_tokens=False)  # the generation prompt opens it
    spans = token_spans(toy_tokenizer, prompt, thinking + answer)
    assert spans["reasoning"] == [True] * len(thinking) + [False] * len(answer)


def step(committed: int) -> Step:
    return Step(
        draft_tokens=3,
        depth=3,
        accepted=committed - 1,
        committed=committed,
        cache_len=0,
        draft_s=0,
        verify_s=0,
    )


def test_tau_per_span_by_hand():
    # tokens 0..9: token 0 from the prefill; steps commit 3 (tokens 1-3), 4 (4-7), 1 (8), 1 (9)
    # tool call on tokens 4..8: the step starting at 4 and the one at 8 are in it, the others prose
    gen = Generation(tokens=list(range(10)), steps=[step(3), step(4), step(1), step(1)])
    call = [False] * 4 + [True] * 5 + [False]
    turn = TurnResult("a", 0, 5, gen, spans={"tool_call": call, "reasoning": [False] * 10}, has_tools=True)
    plain = TurnResult("b", 0, 5, Generation(tokens=[0, 1, 2], steps=[step(2)]), spans=None)
    assert by_span([turn, plain]) == {
        "tool_call": {"steps": 2, "tokens": 5, "tau": 2.5},
        "prose": {"steps": 2, "tokens": 4, "tau": 2.0},
    }
    # pooled: the steps of both partitions add up to every step of the turns that have spans
    report = summarize([turn])
    spans = report["by_span"]
    assert spans["tool_call"]["tokens"] + spans["prose"]["tokens"] == gen.step_tokens
    assert report["tau"] == pytest.approx(9 / 4)
    report.update(
        settings={"drafter": "d", "tree": "chain", "depth": 3, "temperature": 0, "top_p": 1, "top_k": 0},
        num_prompts=1,
        num_turns=1,
        lossless=None,
    )
    assert "| tool call | 2 | 5 | 2.500 |" in markdown(report)


def test_partitions_appear_only_where_they_apply():
    gen = Generation(tokens=list(range(4)), steps=[step(3)])
    quiet = {"tool_call": [False] * 4, "reasoning": [False] * 4}
    assert (
        by_span([TurnResult("a", 0, 5, gen, spans=quiet)]) == {}
    )  # no tools offered, none called, no thinking
    assert set(by_span([TurnResult("a", 0, 5, gen, spans=quiet, has_tools=True)])) == {"tool_call", "prose"}
    thinking = {"tool_call": [False] * 4, "reasoning": [True] * 4}
    assert by_span([TurnResult("a", 0, 5, gen, spans=thinking)]) == {
        "reasoning": {"steps": 1, "tokens": 3, "tau": 3.0},
        "answer": {"steps": 0, "tokens": 0, "tau": None},
    }
    assert json.dumps(by_span([]))  # serializable, empty


def test_the_plot_shows_tau_by_category_context_and_span(tmp_path):
    from draftsmith.eval.report import plot_acceptance, plot_panels

    report = {
        "acceptance_by_depth": [0.5, None],
        "by_category": {"math": {"tau": 2.0}, "writing": {"tau": 1.5}},
        "by_context": [{"context": "1-512", "tau": 1.8}, {"context": "513-1024", "tau": None}],
        "by_span": {"tool_call": {"tau": 3.0}, "prose": {"tau": 1.2}},
        "settings": {"drafter": "runs/x/final", "tree": "chain", "temperature": 0},
        "tau": 1.7,
    }
    assert plot_panels(report) == [
        ("acceptance by depth", ["1", "2"], [0.5, 0.0], "P(accept d | accepted d-1)"),
        ("tau by category", ["math", "writing"], [2.0, 1.5], "tau (pooled)"),
        ("tau by context tokens", ["1-512", "513-1024"], [1.8, 0.0], "tau (pooled)"),
        ("tau by span", ["tool call", "prose"], [3.0, 1.2], "tau (pooled)"),
    ]
    report["by_category"] = {"math": {"tau": 2.0}}  # one bar says nothing the title does not
    assert [p[0] for p in plot_panels(report)] == [
        "acceptance by depth",
        "tau by context tokens",
        "tau by span",
    ]
    plot_acceptance(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_evaluator_reports_tau_on_tool_calls_and_prose_for_tool_data(
    tiny_toy_target, shared_data, tmp_path
):
    from draftsmith.eval.acceptance import main

    report_path = tmp_path / "r.json"
    args = ["--target", str(tiny_toy_target), "--drafter", "ngram", "--no-progress", "--max-new-tokens", "24"]
    data = str(shared_data / "llamafactory_demo" / "glaive_toolcall_en_demo.json")
    assert main([*args, "--data", data, "--num-prompts", "2", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    spans = report["by_span"]
    assert set(spans) >= {"tool_call", "prose"}  # the data offers tools: both rows, even with no call made
    assert spans["tool_call"]["steps"] + spans["prose"]["steps"] == report["verification_forwards"]
