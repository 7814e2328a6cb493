"""`draftsmith data mix`: deduplication, held-out prompts, document pieces, the shuffle, the meta, the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftsmith.data.conversations import read_conversations
from draftsmith.data.formats import Conversation
from draftsmith.data.mix import SourceSpec, content_key, mix_sources, split_document
from draftsmith.scripts.data.mix import main as mix_main


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def chat(user: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, str]:
    a = write_jsonl(
        tmp_path / "a.jsonl",
        [
            chat("What is 2+2?", "4."),
            chat("what is  2+2?", "4."),  # a duplicate of the first: case and whitespace aside
            chat("Name a colour.", "Blue."),
            chat("Held out prompt", "an answer"),
            chat("", ""),  # nothing at all
        ],
    )
    b = write_jsonl(
        tmp_path / "b.jsonl",
        [{"question": "Name a colour.", "answer": "blue."}, {"question": "Why?", "answer": "Because."}],
    )
    docs = tmp_path / "docs.jsonl"
    write_jsonl(docs, [{"text": "para one\n\npara two"}, {"text": "x" * 50}])
    held = write_jsonl(tmp_path / "eval.jsonl", [{"turns": ["held OUT prompt"]}])
    return {"a": a, "b": b, "docs": str(docs), "held": held}


def test_source_spec_limits():
    assert SourceSpec.parse("data.jsonl@5") == SourceSpec("data.jsonl", 5)
    assert SourceSpec.parse("hf:me/x@y") == SourceSpec("hf:me/x@y")  # not a count: part of the name
    assert SourceSpec.parse("stdlib:train") == SourceSpec("stdlib:train")
    for bad in ("0", "-1", "2.5", "nan", "+3"):
        with pytest.raises(ValueError, match=f"must be an integer >= 1, got '{re.escape(bad)}'"):
            SourceSpec.parse(f"data.jsonl@{bad}")


def test_mix_drops_duplicates_held_out_prompts_and_empty_records(sources):
    specs = [SourceSpec(sources["a"]), SourceSpec(sources["b"]), SourceSpec(sources["docs"])]
    mix = mix_sources(specs, exclude=[sources["held"]], count_tokens=lambda c: 1, document_chars=100)
    a, b, docs = mix.counts
    assert (a.records, a.kept, a.duplicates, a.held_out, a.empty) == (5, 2, 1, 1, 1)
    # "Name a colour." / "blue." is a duplicate of a's record only if the assistant text matches: it does
    assert (b.records, b.kept, b.duplicates) == (2, 1, 1)
    assert (docs.records, docs.kept) == (2, 2)
    for c in mix.counts:
        assert c.records == c.kept + c.duplicates + c.held_out + c.empty  # no document was cut here
        assert c.tokens == c.kept
    assert len(mix.records) == 5 and mix.excluded_prompts == 1
    users = {r["messages"][0]["content"] for r in mix.records if "messages" in r}
    assert users == {"What is 2+2?", "Name a colour.", "Why?"}
    assert {r["source"] for r in mix.records} == {sources["a"], sources["b"], sources["docs"]}


def test_the_shuffle_is_seeded_and_a_prefix_is_a_sample_of_the_same_mix(sources):
    specs = [SourceSpec(sources["a"]), SourceSpec(sources["b"]), SourceSpec(sources["docs"])]
    first, again = mix_sources(specs, seed=1), mix_sources(specs, seed=1)
    assert first.records == again.records
    other = mix_sources(specs, seed=2)
    assert sorted(map(json.dumps, other.records)) == sorted(map(json.dumps, first.records))
    assert [r["source"] for r in first.records] != [r["source"] for r in specs_order(first)]


def specs_order(mix):
    return sorted(mix.records, key=lambda r: r["source"])


def test_documents_are_cut_at_paragraphs_and_lose_only_the_separators():
    text = "alpha beta\n\n" + "gamma " * 30 + "\n" + "delta " * 5 + "\n\nend"
    pieces = [str(c.text) for c in split_document(Conversation([], text=text), 60)]
    assert all(0 < len(p) <= 60 for p in pieces) and len(pieces) > 3
    assert pieces[0] == "alpha beta" and pieces[-1] == "end"
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)
    conv = Conversation([{"role": "user", "content": "x" * 500}])
    assert split_document(conv, 60) == [conv]  # conversations are never cut


def test_content_key_ignores_case_and_whitespace_only():
    one = Conversation([{"role": "user", "content": "Hello  World"}])
    assert content_key(one) == content_key(Conversation([{"role": "user", "content": "hello world "}]))
    assert content_key(one) != content_key(Conversation([{"role": "assistant", "content": "hello world"}]))
    assert content_key(one) != content_key(Conversation([], text="user hello world"))


def test_cli_writes_a_file_every_recipe_reads_and_its_meta(sources, tmp_path, capsys):
    out = tmp_path / "mix.jsonl"
    argv = [
        sources["a"],
        f"{sources['b']}@1",
        sources["docs"],
        "--exclude",
        sources["held"],
        "--out",
        str(out),
    ]
    assert mix_main(argv) == 0
    convs = read_conversations(str(out))  # chat records and documents in one file
    assert (
        len(convs) == 4 and sum(c.text is not None for c in convs) == 2
    )  # b@1: its first record, a duplicate
    meta = json.loads((tmp_path / "mix.jsonl.meta.json").read_text())
    assert meta["written_by"] == "draftsmith data mix" and meta["records"] == 4 and meta["tokens"] is None
    assert [s["records"] for s in meta["sources"]] == [5, 1, 2]
    assert meta["sources"][0]["sha256"] and meta["exclude"] == [sources["held"]]
    before = out.read_bytes()
    assert mix_main(argv) == 0 and out.read_bytes() == before  # the same command writes the same bytes
    assert "wrote 4 records" in capsys.readouterr().out


def test_cli_refuses_a_file_it_did_not_write_and_an_empty_mix(sources, tmp_path):
    from draftsmith.runtime.errors import UserError

    foreign = tmp_path / "notes.jsonl"
    foreign.write_text("keep me\n")
    with pytest.raises(UserError, match="is not a `draftsmith data mix` output"):
        mix_main([sources["a"], "--out", str(foreign)])
    assert foreign.read_text() == "keep me\n"
    empty = write_jsonl(tmp_path / "empty.jsonl", [chat("", "")])
    with pytest.raises(UserError, match="the mix is empty"):
        mix_main([empty, "--out", str(tmp_path / "out.jsonl")])
    with pytest.raises(SystemExit):
        mix_main([sources["a"], "--out", str(tmp_path / "o.jsonl"), "--document-chars", "5"])
