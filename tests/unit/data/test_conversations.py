"""read_conversations on every real data file, every source kind and every error kind; prompt_turns."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from draftsmith.data.conversations import (
    Conversation,
    detect_format,
    prompt_turns,
    read_conversations,
)

# relative path -> (detected format, conversations read). Counts are the record counts of SOURCES.md;
# each Alpaca seed task holds one {input, output} instance.
REAL_FILES = {
    "alpaca_seed/seed_tasks.jsonl": ("alpaca", 175),
    "alpaca_tiny/alpaca_tiny.json": ("alpaca", 100),
    "eagle_eval_sets/alpaca.question.jsonl": ("turns", 80),
    "eagle_eval_sets/gsm8k.question.jsonl": ("turns", 80),
    "eagle_eval_sets/humaneval.question.jsonl": ("turns", 80),
    "eagle_eval_sets/qa.question.jsonl": ("turns", 80),
    "eagle_eval_sets/sum.question.jsonl": ("turns", 80),
    "gsm8k/test.jsonl": ("pair", 1319),
    "gsm8k/test_socratic.jsonl": ("pair", 1319),
    "gsm8k/train.jsonl": ("pair", 7473),
    "humaneval/HumanEval.jsonl.gz": ("pair", 164),
    "llamafactory_demo/alpaca_en_demo.json": ("alpaca", 999),
    "llamafactory_demo/c4_demo.jsonl": ("text", 300),
    "llamafactory_demo/dpo_en_demo.json": ("sharegpt", 300),
    "llamafactory_demo/glaive_toolcall_en_demo.json": ("sharegpt", 300),
    "llamafactory_demo/wiki_demo.txt": ("text", 30),
    "mt_bench/question.jsonl": ("turns", 80),
    "mt_bench/reference_answer_gpt-4.jsonl": ("answers", 30),
    "sharegpt_prompts/ShareGPT_V3_filtered_1000.json": ("sharegpt", 1000),
    "sharegpt_prompts/ShareGPT_V3_filtered_500.json": ("sharegpt", 500),
    "sharegpt_prompts/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json": ("sharegpt", 2978),
}


def _raw_records(path: Path) -> list[dict[str, Any]]:
    """Independent reader for the oracle: the JSON files exactly as stored."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _write(path: Path, text: str | bytes) -> str:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return str(path)


def test_every_real_file_is_listed(shared_data: Path) -> None:
    found = {
        str(p.relative_to(shared_data))
        for p in shared_data.rglob("*")
        if p.is_file() and p.name not in ("LICENSE", "DATA_LICENSE", "SHA256SUMS", "SOURCES.md")
    }
    assert found == set(REAL_FILES)


@pytest.mark.parametrize("rel", sorted(REAL_FILES))
def test_real_file_reads(shared_data: Path, rel: str) -> None:
    fmt, count = REAL_FILES[rel]
    path = shared_data / rel
    convs = read_conversations(str(path))
    assert len(convs) == count
    assert convs[0].source == f"{path}:0" and convs[-1].source.startswith(f"{path}:")
    if path.suffix != ".txt":
        assert detect_format(_raw_records(path)[0], "first") == fmt
    for conv in convs:
        assert (conv.text is None) == (fmt != "text")
        assert all(
            isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant", "tool")
            for m in conv.messages
        )


def test_pair_and_humaneval_content(shared_data: Path) -> None:
    raw = _raw_records(shared_data / "gsm8k/test.jsonl")[5]
    conv = read_conversations(str(shared_data / "gsm8k/test.jsonl"))[5]
    assert conv.messages == [
        {"role": "user", "content": raw["question"]},
        {"role": "assistant", "content": raw["answer"]},
    ]
    human = shared_data / "humaneval/HumanEval.jsonl.gz"
    raw = _raw_records(human)[3]
    conv = read_conversations(str(human))[3]
    assert conv.id == "HumanEval/3"
    assert [m["content"] for m in conv.messages] == [raw["prompt"], raw["canonical_solution"]]


def test_alpaca_input_joined_and_seed_instances(shared_data: Path) -> None:
    path = shared_data / "llamafactory_demo/alpaca_en_demo.json"
    raws = _raw_records(path)
    k = next(i for i, r in enumerate(raws) if r["input"])
    conv = read_conversations(str(path))[k]
    assert conv.messages[0]["content"] == raws[k]["instruction"] + "\n\n" + raws[k]["input"]
    assert conv.messages[1] == {"role": "assistant", "content": raws[k]["output"]}
    assert conv.source == f"{path}:{k}"
    seeds = read_conversations(str(shared_data / "alpaca_seed/seed_tasks.jsonl"))
    raw = _raw_records(shared_data / "alpaca_seed/seed_tasks.jsonl")[0]
    assert seeds[0].id == "seed_task_0#0"
    assert seeds[0].messages[1]["content"] == raw["instances"][0]["output"]


def test_sharegpt_roles_tools_and_dpo_chosen(shared_data: Path) -> None:
    path = shared_data / "llamafactory_demo/glaive_toolcall_en_demo.json"
    raw = _raw_records(path)[0]
    conv = read_conversations(str(path))[0]
    expected_roles = {
        "human": "user",
        "gpt": "assistant",
        "function_call": "assistant",
        "observation": "tool",
    }
    assert [m["role"] for m in conv.messages] == [expected_roles[t["from"]] for t in raw["conversations"]]
    assert [m["content"] for m in conv.messages] == [t["value"] for t in raw["conversations"]]
    assert conv.tools is not None and conv.tools == json.loads(raw["tools"])
    assert conv.tools[0]["name"] == "search_recipes"

    dpo = shared_data / "llamafactory_demo/dpo_en_demo.json"
    raws = _raw_records(dpo)
    k = next(i for i, r in enumerate(raws) if r["conversations"][0]["from"] == "system")
    conv = read_conversations(str(dpo))[k]
    assert conv.messages[0] == {"role": "system", "content": raws[k]["conversations"][0]["value"]}
    assert conv.messages[-1] == {"role": "assistant", "content": raws[k]["chosen"]["value"]}
    assert len(conv.messages) == len(raws[k]["conversations"]) + 1


def test_turns_with_and_without_references(shared_data: Path) -> None:
    path = shared_data / "mt_bench/question.jsonl"
    raws = _raw_records(path)
    convs = read_conversations(str(path))
    plain = next(i for i, r in enumerate(raws) if "reference" not in r)
    assert convs[plain].messages == [{"role": "user", "content": t} for t in raws[plain]["turns"]]
    ref = next(i for i, r in enumerate(raws) if "reference" in r)
    r = raws[ref]
    assert [m["content"] for m in convs[ref].messages] == [
        r["turns"][0],
        r["reference"][0],
        r["turns"][1],
        r["reference"][1],
    ]
    assert convs[ref].id == str(r["question_id"])
    answers = read_conversations(str(shared_data / "mt_bench/reference_answer_gpt-4.jsonl"))
    raw = _raw_records(shared_data / "mt_bench/reference_answer_gpt-4.jsonl")[0]
    assert answers[0].messages == [{"role": "assistant", "content": t} for t in raw["choices"][0]["turns"]]


def test_fields_no_format_reads_may_have_any_shape(tmp_path: Path) -> None:
    """Spec-Bench's question.jsonl: its RAG rows carry `reference` as lists of retrieved documents, not answers;
    they read as their user turns, as do extra fields of any shape."""
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["a", "b"], "reference": ["ra", "rb"]},
        {
            "question_id": 2,
            "category": "rag",
            "turns": ["q"],
            "reference": [["doc 1", "doc 2"]],
            "x": {"y": [1]},
        },
        {"question_id": 3, "turns": ["p"], "reference": None, "meta": [[1, 2], {"k": None}]},
    ]
    path = _write(tmp_path / "question.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    convs = read_conversations(path)
    assert [[m["content"] for m in c.messages] for c in convs] == [["a", "ra", "b", "rb"], ["q"], ["p"]]
    assert [c.id for c in convs] == ["1", "2", "3"]


def test_text_documents(shared_data: Path, tmp_path: Path) -> None:
    wiki = shared_data / "llamafactory_demo/wiki_demo.txt"
    lines = [ln for ln in wiki.read_text(encoding="utf-8").split("\n") if ln.strip()]
    assert [c.text for c in read_conversations(str(wiki))] == lines
    c4 = read_conversations(str(shared_data / "llamafactory_demo/c4_demo.jsonl"))
    assert c4[0].text == _raw_records(shared_data / "llamafactory_demo/c4_demo.jsonl")[0]["text"]
    assert c4[0].messages == []
    # Blank lines separate documents; single newlines inside a paragraph do not.
    prose = _write(tmp_path / "prose.txt", "first line\nstill first\n\n \nsecond\r\n\r\nthird\n")
    assert [c.text for c in read_conversations(prose)] == ["first line\nstill first", "second", "third"]


def test_format_override_and_limit(shared_data: Path) -> None:
    path = str(shared_data / "alpaca_tiny/alpaca_tiny.json")
    as_text = read_conversations(path, format="text", limit=3)
    assert len(as_text) == 3
    assert as_text[0].text == _raw_records(Path(path))[0]["text"]
    assert len(read_conversations(str(shared_data / "gsm8k/train.jsonl"), limit=7)) == 7
    assert read_conversations(path, limit=0) == []


MESSAGES: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ],
        "id": 7,
    },
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
]


def _expected_messages() -> list[list[dict[str, str]]]:
    return [[{"role": m["role"], "content": m["content"]} for m in r["messages"]] for r in MESSAGES]


def test_local_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = "\n".join(json.dumps(r) for r in MESSAGES) + "\n"
    expected = _expected_messages()
    sources = {
        "a.jsonl": _write(tmp_path / "a.jsonl", jsonl),
        "lines.json": _write(tmp_path / "lines.json", jsonl),  # JSON Lines under a .json name
        "array.json": _write(tmp_path / "array.json", json.dumps(MESSAGES, indent=2)),
        "a.jsonl.gz": _write(tmp_path / "a.jsonl.gz", gzip.compress(jsonl.encode())),
        "a.json.gz": _write(tmp_path / "a.json.gz", gzip.compress(json.dumps(MESSAGES).encode())),
    }
    pq.write_table(pa.Table.from_pylist(MESSAGES), tmp_path / "a.parquet")
    sources["a.parquet"] = str(tmp_path / "a.parquet")
    datasets.Dataset.from_list(MESSAGES).save_to_disk(str(tmp_path / "saved"))
    sources["saved"] = str(tmp_path / "saved")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(MESSAGES)})
    dd.save_to_disk(str(tmp_path / "saved_dict"))
    sources["saved_dict"] = str(tmp_path / "saved_dict")
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    _write(hub_dir / "train.jsonl", jsonl)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    sources["hf"] = f"hf:{hub_dir}"
    sources["hf split"] = f"hf:{hub_dir}:train"
    for name, source in sources.items():
        convs = read_conversations(source)
        assert [c.messages for c in convs] == expected, name
        assert convs[1].source == f"{source}:1", name
    assert read_conversations(sources["a.jsonl"])[0].id == "7"


@pytest.mark.skipif(
    importlib.util.find_spec("draftsmith.data.stdlib_corpus") is None, reason="no stdlib corpus"
)
def test_stdlib_builtin() -> None:
    from draftsmith.data.stdlib_corpus import stdlib_conversations

    convs = read_conversations("stdlib:heldout", limit=4)
    raw = stdlib_conversations("heldout")[:4]
    assert [c.messages for c in convs] == [r["messages"] for r in raw]
    assert [c.id for c in convs] == [r["id"] for r in raw]
    assert convs[2].source == "stdlib:heldout:2"


def _error(tmp_path: Path, name: str, content: str | bytes, **kwargs: Any) -> str:
    path = _write(tmp_path / name, content)
    with pytest.raises(ValueError) as info:
        read_conversations(path, **kwargs)
    message = str(info.value)
    assert path in message
    return message


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_conversations(str(tmp_path / "nope.jsonl"))
    assert "empty" in _error(tmp_path, "empty.jsonl", "  \n")
    assert "no records" in _error(tmp_path, "empty.json", "[]")
    msg = _error(tmp_path, "latin.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert "UTF-8" in msg and "byte offset 28" in msg and "line 2" in msg
    msg = _error(tmp_path, "bad.jsonl", '{"text": "a"}\n\n{"text": "b"}\n{"text": \n')
    assert "bad.jsonl:2" in msg and "line 4" in msg
    msg = _error(tmp_path, "bad.json", '[\n  {"text": "a"},\n  {"text": "b",}\n]')
    assert "line 3" in msg
    msg = _error(tmp_path, "wrapped.json", '{\n  "data": [{"text": "a"}]\n}')  # one object, not records
    assert "wrapped.json:0" in msg and "keys ['data']" in msg
    assert "gzip" in _error(tmp_path, "fake.jsonl.gz", b"not gzip")
    assert "unsupported file type" in _error(tmp_path, "data.csv", "a,b\n")
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ValueError, match="save_to_disk"):
        read_conversations(str(tmp_path / "plain_dir"))
    with pytest.raises(ValueError, match="load_dataset"):
        read_conversations(f"hf:{tmp_path / 'no_such_dataset'}")
    with pytest.raises(ValueError, match="format='yaml'"):
        read_conversations(str(tmp_path / "bad.json"), format="yaml")


def test_record_level_errors(tmp_path: Path) -> None:
    def bad(record: Any, first: dict[str, Any] = MESSAGES[1]) -> str:
        """Read a file whose record 0 is fine (and sets the format) and record 1 is `record`."""
        return _error(tmp_path, "r.jsonl", json.dumps(first) + "\n" + json.dumps(record) + "\n")

    assert "r.jsonl:1" in bad([1, 2]) and "expected a JSON object" in bad([1, 2])
    for message, needle in [
        ({"content": "x"}, "missing or empty role"),
        ({"role": "", "content": "x"}, "missing or empty role"),
        ({"role": "robot", "content": "x"}, "role 'robot'"),
        ({"role": "user", "content": None}, "content of type NoneType"),
        ({"role": "user", "content": 5}, "content of type int"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "type 'image_url'"),
    ]:
        msg = bad({"messages": [{"role": "user", "content": "q"}, message]})
        assert "r.jsonl:1" in msg and "message 1" in msg and needle in msg
    msg = bad({"conversations": [{"from": "alien", "value": "x"}]}, first={"conversations": []})
    assert "r.jsonl:1" in msg and "alien" in msg
    msg = bad({"instruction": "do", "output": 3}, first={"instruction": "i", "output": "o"})
    assert "r.jsonl:1" in msg and "'output' is a int" in msg
    # Each record's own keys decide its format (a `draftsmith data mix` file holds chats and documents); a
    # record of no known format is named; an explicit format holds for every record.
    (tmp_path / "m.jsonl").write_text(
        json.dumps(MESSAGES[1]) + "\n" + json.dumps({"question": "q", "answer": "a"})
    )
    mixed = read_conversations(str(tmp_path / "m.jsonl"))
    assert [m["content"] for m in mixed[1].messages] == ["q", "a"]
    assert "r.jsonl:1" in bad({"prompt_text": "q"}) and "cannot tell the data format" in bad(
        {"prompt_text": "q"}
    )
    with pytest.raises(ValueError, match="format 'messages' needs keys messages"):
        read_conversations(str(tmp_path / "m.jsonl"), format="messages")


# Rows as a server that answers with OpenAI content-part lists writes them, and the text each message holds.
CONTENT_PART_ROWS = [
    {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Name "},
                    {"type": "input_text", "text": "a"},
                    " fruit.",
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Apple"}, {"type": "text", "text": "."}],
            },
        ]
    },
    {"messages": [{"role": "user", "content": "plain"}, {"role": "assistant", "content": []}]},
    {
        "conversations": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"from": "gpt", "value": ["yo"]},
        ]
    },
]
FLATTENED = [
    [("system", "Be brief."), ("user", "Name a fruit."), ("assistant", "Apple.")],
    [("user", "plain"), ("assistant", "")],
    [("user", "hi"), ("assistant", "yo")],
]


def test_content_part_lists_read_as_their_concatenated_text(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def text(source: str, **kwargs: Any) -> list[list[tuple[str, str]]]:
        return [[(m["role"], m["content"]) for m in c.messages] for c in read_conversations(source, **kwargs)]

    messages_rows = CONTENT_PART_ROWS[:2]
    lines = "".join(json.dumps(r) + "\n" for r in messages_rows)
    assert text(_write(tmp_path / "parts.jsonl", lines)) == FLATTENED[:2]
    assert text(_write(tmp_path / "parts.json", json.dumps(messages_rows))) == FLATTENED[:2]
    assert text(_write(tmp_path / "sharegpt.jsonl", json.dumps(CONTENT_PART_ROWS[2]))) == FLATTENED[2:]
    rows = [
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}
            ]
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "parts.parquet")
    assert text(str(tmp_path / "parts.parquet")) == [[("user", "xy")]]


def test_a_non_text_content_part_is_refused_naming_the_file_row_and_message(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    rows = [
        CONTENT_PART_ROWS[1],
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]},
    ]
    msg = _error(tmp_path, "mixed.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert msg.startswith(
        f"{tmp_path / 'mixed.jsonl'}:1: message 0 (user): content part 1 has type 'image_url'"
    )
    assert "\n" not in msg


def test_unknown_shape_lists_formats(tmp_path: Path) -> None:
    msg = _error(tmp_path, "odd.jsonl", '{"foo": 1, "bar": 2}\n')
    assert "odd.jsonl:0" in msg and "['bar', 'foo']" in msg
    for fmt in (
        "messages (messages)",
        "sharegpt (conversations)",
        "alpaca (instruction + output",
        "turns (turns)",
        "pair (question + answer",
        "text (text)",
    ):
        assert fmt in msg
    msg = _error(tmp_path, "forced.jsonl", '{"question": "q", "answer": "a"}\n', format="alpaca")
    assert "forced.jsonl:0" in msg and "instruction + output" in msg


def test_prompt_turns() -> None:
    conv = Conversation(
        messages=[
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "A2"},
        ],
        source="x:0",
    )
    s, u1, u2 = conv.messages[0], conv.messages[1], conv.messages[3]
    assert prompt_turns(conv) == [[s, u1], [s, u1, u2]]
    assert prompt_turns(Conversation(messages=[], text="doc", source="x:1")) == []
