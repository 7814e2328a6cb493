"""`data regenerate --endpoint` against vLLM's own OpenAI-compatible server (the CPU build `draftsmith engine-setup
vllm` installs) serving SmolLM2-135M-Instruct on 127.0.0.1: multi-turn chats and tool-call chats go through
it, the server is killed mid-run, and a rerun against a restarted server finishes the file with nothing lost
or written twice."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from draftsmith.data.conversations import read_conversations
from draftsmith.engines.vllm_server import serve
from draftsmith.runtime.errors import UserError
from draftsmith.scripts.data.regenerate import parse_args, regenerate

pytestmark = pytest.mark.engine


@pytest.mark.slow  # about 2 minutes; the served path's answers and resume stay in the default run (below)
def test_regeneration_through_vllm_survives_a_killed_server(vllm_env, smollm2_target, shared_data, tmp_path):
    questions = [json.loads(line) for line in (shared_data / "mt_bench" / "question.jsonl").open()][:12]
    rows = [
        {"messages": [{"role": "user", "content": t} for t in q["turns"]], "category": q["category"]}
        for q in questions
    ]
    glaive = json.loads((shared_data / "llamafactory_demo" / "glaive_toolcall_en_demo.json").read_text())
    tools = [
        r
        for r in glaive
        if json.loads(r["tools"]) and any(t["from"] == "observation" for t in r["conversations"])
    ][:2]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    out = tmp_path / "out.jsonl"

    def run(url: str, source: str, target: str, *extra: str) -> dict:
        args = ["--endpoint", url, "--data", source, "--out", target, "--temperature", "0"]
        args += ["--max-new-tokens", "32", "--concurrency", "4", "--retries", "1", "--no-progress", *extra]
        return regenerate(parse_args(args))

    outcome: dict = {}
    with serve(
        vllm_env, smollm2_target, tmp_path / "server-1.log", name="smollm2", max_model_len=2048
    ) as server:

        def first_run() -> None:
            try:
                outcome["counts"] = run(server.url, str(data), str(out))
            except UserError as err:
                outcome["error"] = str(err)

        thread = threading.Thread(target=first_run)
        thread.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and thread.is_alive():
            if out.is_file() and len(out.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        server.kill()  # mid-run: requests in flight get no answer
        thread.join(timeout=120)
    assert "counts" not in outcome, "the run finished before the server was killed: nothing was tested"
    assert "rerun the same command to continue" in outcome["error"]
    before = out.read_text()
    written = len(before.splitlines())
    assert 2 <= written < len(rows)
    assert not out.with_name("out.jsonl.failed.jsonl").read_text()  # a dead server fails no conversation

    with serve(
        vllm_env, smollm2_target, tmp_path / "server-2.log", name="smollm2", max_model_len=2048
    ) as server:
        counts = run(server.url, str(data), str(out))
        tool_counts = run(server.url, str(tmp_path / "tools.json"), str(tmp_path / "tools-out.jsonl"))
    assert (counts["skipped"], counts["written"], counts["failed"]) == (written, len(rows) - written, 0)
    assert out.read_text().startswith(before)  # the first run's rows are kept as they were
    regenerated = [json.loads(line) for line in out.open()]
    assert sorted(r["index"] for r in regenerated) == list(range(len(rows)))  # each once
    for r in regenerated:
        q = questions[r["index"]]
        assert [m["content"] for m in r["messages"] if m["role"] == "user"] == q["turns"]
        answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert len(answers) == 2 and all(answers) and r["category"] == q["category"]
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    # the served model by its name and its weights' path (vLLM's `root`): a resume checks both
    assert meta["target"] == {"served_model": "smollm2", "root": meta["target"]["root"]}
    assert Path(meta["target"]["root"]).samefile(smollm2_target) and meta["server"]["max_model_len"] == 2048
    assert counts["answers"] == 2 * counts["written"] and counts["completion_tokens"] > 0

    # tool-call chats: the tools reach the template, each answer is the model's, the schemas are kept
    assert tool_counts["written"] == 2 and tool_counts["failed"] == 0
    back = sorted(
        (json.loads(line) for line in (tmp_path / "tools-out.jsonl").open()), key=lambda r: r["index"]
    )
    assert [r["tools"] for r in back] == [json.loads(t["tools"]) for t in tools]
    # each chat either went on past the recorded tool result (the model made the recorded call) or ended at
    # the model's own turn there, counted
    continued = sum(any(m["role"] == "tool" for m in r["messages"]) for r in back)
    assert continued + tool_counts["tool_call_differs"] == 2
    assert all(r["messages"][-1]["role"] == "assistant" for r in back)
    assert len(read_conversations(str(tmp_path / "tools-out.jsonl"))) == 2  # training reads it as it is


def test_serve_vllm_answers_as_generate_does_and_a_rerun_resumes(
    vllm_env, smollm2_target, shared_data, tmp_path
):
    """`--target DIR --serve vllm`: draftsmith serves the target itself for the run; its greedy answers equal the
    local `generate` path's (both float32), the served model is recorded by its weights' path, the server is gone
    afterwards, and a rerun with the same command finds everything done."""
    data = shared_data / "gsm8k" / "test.jsonl"
    common = ["--data", str(data), "--max-samples", "4", "--temperature", "0", "--max-new-tokens", "24"]

    def served() -> dict:
        args = ["--target", str(smollm2_target), "--serve", "vllm", "--out", str(tmp_path / "served.jsonl")]
        return regenerate(parse_args([*args, *common, "--concurrency", "4", "--no-progress"]))

    counts = served()
    local = ["--target", str(smollm2_target), "--out", str(tmp_path / "local.jsonl"), "--dtype", "float32"]
    regenerate(parse_args([*local, *common, "--batch-size", "1", "--no-progress"]))

    def answers(name: str) -> dict[int, list[str]]:
        rows = [json.loads(line) for line in (tmp_path / name).open()]
        return {r["index"]: [m["content"] for m in r["messages"] if m["role"] == "assistant"] for r in rows}

    assert counts["written"] == 4 and counts["failed"] == 0
    assert answers("served.jsonl") == answers("local.jsonl")
    meta = json.loads((tmp_path / "served.jsonl.meta.json").read_text())
    assert meta["target"]["served_model"] == "target"
    assert Path(meta["target"]["root"]) == smollm2_target.resolve()
    log = tmp_path / "served.jsonl.server.log"
    assert log.is_file()
    port = int(meta["endpoint"].rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ConnectionRefusedError):  # the server was stopped with the run
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    again = served()
    assert (again["written"], again["skipped"]) == (0, 4)
