"""The fault catalogue, part 2: `draftsmith data regenerate --endpoint` against an OpenAI-compatible server that
refuses, trickles, lies and dies (tests/reliability/fake_openai.py), and against outputs, flags and inputs a
user gets wrong. Each case ends in one line with a non-zero exit and no traceback; where the server was at
fault nothing is marked failed, and the rerun after the fix writes every conversation once; where the input
was at fault nothing that existed is changed.

The catalogue's verdicts are collected by bench/reliability_table.py into docs/BENCHMARKS.md "Fault catalogue".
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_openai import MODELS, FakeOpenAI, Reply, as_json, completion, lie, refuse
from fault_catalogue import check_one_line, record, run_case, run_cli

from draftsmith.data.conversations import read_conversations
from draftsmith.runtime import http
from draftsmith.scripts.cli import main as cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", (0.01, 0.02))


@pytest.fixture
def server():
    with FakeOpenAI() as srv:
        yield srv


def chats(path: Path, n: int, prefix: str = "question") -> Path:
    rows = [{"messages": [{"role": "user", "content": f"{prefix} {i}"}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def regen(url: str, data: Path, out: Path) -> list[str]:
    return ["data", "regenerate", "--endpoint", url, "--data", str(data), "--out", str(out), "--no-progress"]


def start_regenerate(url: str, data: Path, out: Path, concurrency: str, stderr: int) -> subprocess.Popen:
    """`draftsmith data regenerate` in a process of its own (to be interrupted or killed), stderr as text."""
    argv = [
        sys.executable,
        "-m",
        "draftsmith.scripts.cli",
        *regen(url, data, out),
        "--concurrency",
        concurrency,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # Ctrl-C's default action in the child, whatever the suite inherited: a suite started in the background by
    # a shell without job control runs with SIGINT ignored, a child then inherits that, and Python keeps an
    # ignored SIGINT ignored (this is what made the Ctrl-C test below hang in two full runs).
    default_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    return subprocess.Popen(argv, stderr=stderr, text=True, env=env, preexec_fn=default_sigint)


def wait_rows(out: Path, n: int) -> None:
    """Until OUT holds `n` complete lines (or a minute has passed)."""
    deadline = time.monotonic() + 60
    while (out.read_bytes().count(b"\n") if out.is_file() else 0) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []


def failed_of(out: Path) -> list[dict]:
    return rows_of(out.with_name(out.name + ".failed.jsonl"))


# ---- the server refuses, or lies: the run stops in one line, nothing marked failed, the rerun goes on -----------

SERVER_FAULTS: dict[str, tuple[Callable[[FakeOpenAI], None], str]] = {
    "chat-401-wrong-key": (
        lambda s: setattr(s, "chat", refuse(401, {"error": {"message": "Invalid API key"}})),
        "/v1/chat/completions: HTTP 401: Invalid API key; nothing was marked failed: check the key",
    ),
    "chat-403-forbidden": (
        lambda s: setattr(s, "chat", refuse(403, {"error": {"message": "forbidden"}})),
        "HTTP 403: forbidden; nothing was marked failed",
    ),
    "chat-404-wrong-route": (
        lambda s: setattr(s, "chat", refuse(404, {"detail": "Not Found"})),
        "HTTP 404: Not Found; nothing was marked failed: check --endpoint",
    ),
    "chat-405-wrong-method": (
        lambda s: setattr(s, "chat", refuse(405, {"detail": "Method Not Allowed"})),
        "HTTP 405: Method Not Allowed",
    ),
    "chat-200-no-choices": (
        lambda s: setattr(s, "chat", lie(as_json({"object": "error", "message": "model busy"}))),
        "answered 200 with something that is not a chat completion ('choices')",
    ),
    "chat-200-json-42": (
        lambda s: setattr(s, "chat", lie(as_json(42))),
        "answered 200 application/json with JSON that is not an object: 42",
    ),
    "chat-200-json-null": (
        lambda s: setattr(s, "chat", lie(as_json(None))),
        "with JSON that is not an object: null",
    ),
    "chat-200-choices-strings": (
        lambda s: setattr(s, "chat", lie(as_json({"choices": ["hello"]}))),
        "not a chat completion (`choices` is not a list of choice objects)",
    ),
    "chat-200-message-string": (
        lambda s: setattr(s, "chat", lie(as_json({"choices": [{"message": "hello"}]}))),
        "not a chat completion (its choice has no `message` object)",
    ),
    "chat-200-html-page": (
        lambda s: setattr(
            s,
            "chat",
            lie(Reply(200, b"<!DOCTYPE html><html><title>Sign in - Proxy</title></html>", "text/html")),
        ),
        "answered 200 text/html that is not JSON: an HTML page ('Sign in - Proxy')",
    ),
    "chat-200-not-utf8": (
        lambda s: setattr(s, "chat", lie(Reply(200, b"\xff\xfe\x00garbage", "application/octet-stream"))),
        "whose body is not UTF-8 text (byte 0)",
    ),
    "chat-200-image-part": (
        lambda s: setattr(s, "chat", lie(as_json(completion([{"type": "image_url", "image_url": {}}])))),
        "content part 0 has type 'image_url', not text",
    ),
    "chat-502-html-proxy": (
        lambda s: setattr(
            s, "chat", lie(Reply(502, b"<html><title>502 Bad Gateway</title></html>", "text/html"))
        ),
        "did not answer after 1 retries (HTTP 502: an HTML page ('502 Bad Gateway'))",
    ),
    "chat-400-every-request": (
        lambda s: setattr(s, "chat", refuse(400, {"error": {"message": "top_p must be in (0, 1]"}})),
        "the server refused the first 8 conversations and answered none",
    ),
    "chat-hang-up": (
        lambda s: setattr(s, "chat", lie(Reply(hang_up=True))),
        "did not answer after 1 retries (RemoteDisconnected",
    ),
    "models-401": (
        lambda s: setattr(s, "models", refuse(401, {"error": {"message": "Invalid API key"}})),
        "/v1/models: HTTP 401: Invalid API key; nothing was marked failed: check the key",
    ),
    "models-not-a-list": (
        lambda s: setattr(s, "models", lie(as_json({"data": "fake"}))),
        "answered a model list without a `data` list of models with an `id` each",
    ),
    "models-no-ids": (
        lambda s: setattr(s, "models", lie(as_json({"data": [{"name": "fake"}]}))),
        "answered a model list without a `data` list",
    ),
    "models-json-list": (
        lambda s: setattr(s, "models", lie(as_json([MODELS]))),
        "with JSON that is not an object",
    ),
    "models-html-page": (
        lambda s: setattr(
            s, "models", lie(Reply(200, b"<html><title>Welcome to nginx!</title></html>", "text/html"))
        ),
        "that is not JSON: an HTML page ('Welcome to nginx!')",
    ),
}


@pytest.mark.parametrize("case", list(SERVER_FAULTS))
def test_a_server_fault_stops_the_run_and_the_rerun_after_the_fix_goes_on(case, server, tmp_path, capsys):
    data, out = chats(tmp_path / "in.jsonl", 10), tmp_path / "out.jsonl"
    SERVER_FAULTS[case][0](server)
    code, err = run_cli([*regen(server.url, data, out), "--retries", "1", "--concurrency", "2"], capsys)
    check_one_line(case, code, err, SERVER_FAULTS[case][1])
    assert failed_of(out) == [] and rows_of(out) == []  # nothing marked failed, nothing written
    server.models, server.chat = FakeOpenAI().models, FakeOpenAI().chat  # the fix
    assert cli(regen(server.url, data, out)) == 0
    assert sorted(r["index"] for r in rows_of(out)) == list(range(10)) and failed_of(out) == []


def test_the_conversations_own_refusals_are_recorded_and_retried_on_request(server, tmp_path):
    data, out = chats(tmp_path / "in.jsonl", 12), tmp_path / "out.jsonl"
    too_long = {"error": {"message": "This model's maximum context length is 4096 tokens"}}
    server.chat = lambda body: (
        as_json(too_long, 400)
        if body["messages"][-1]["content"] in ("question 0", "question 3", "question 7")
        else as_json(completion("ok"))
    )
    assert cli([*regen(server.url, data, out), "--concurrency", "1"]) == 0
    # the first refusal came before any answer: held until the server answered one, then recorded
    assert sorted(f["index"] for f in failed_of(out)) == [0, 3, 7]
    assert "maximum context length" in failed_of(out)[0]["reason"]
    server.chat = lambda body: as_json(completion("ok"))  # a server with a longer context
    asked = len(server.asked)
    assert cli(regen(server.url, data, out)) == 0  # a plain rerun skips them
    assert len(server.asked) == asked
    assert cli([*regen(server.url, data, out), "--retry-failed"]) == 0
    assert sorted(r["index"] for r in rows_of(out)) == list(range(12)) and failed_of(out) == []
    assert len(server.asked) == asked + 3


def test_content_part_lists_are_written_as_text_the_pipeline_reads(server, tmp_path):
    data, out = chats(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    parts = [{"type": "text", "text": "Hello"}, {"type": "output_text", "text": ", world"}]
    server.chat = lambda body: as_json(completion(parts))
    assert cli(regen(server.url, data, out)) == 0
    convs = read_conversations(str(out))
    assert [c.messages[-1]["content"] for c in convs] == ["Hello, world", "Hello, world"]


# ---- deadlines and interrupts -------------------------------------------------------------------------------


def test_a_trickling_answer_is_cut_at_the_deadline(server, tmp_path, capsys):
    data, out = chats(tmp_path / "in.jsonl", 1), tmp_path / "out.jsonl"
    body = json.dumps(completion("x" * 400)).encode()
    server.chat = lie(Reply(200, body, trickle_s=0.02))  # about 10 s for the whole answer
    start = time.monotonic()
    code, err = run_cli([*regen(server.url, data, out), "--timeout", "1", "--retries", "0"], capsys)
    took = time.monotonic() - start
    check_one_line("chat-trickle-past-deadline", code, err, "(no complete answer within the 1 s deadline)")
    assert took < 4, f"the 1 s deadline took {took:.1f} s"


def test_ctrl_c_ends_the_run_at_once_in_one_line_and_the_rerun_completes(server, tmp_path):
    data, out = chats(tmp_path / "in.jsonl", 40), tmp_path / "out.jsonl"
    slow = json.dumps(completion("y" * 200)).encode()
    fifth = threading.Event()

    def chat(body: dict) -> Reply:
        n = int(body["messages"][-1]["content"].split()[1])
        if n >= 4:
            fifth.set()
        return Reply(200, slow, trickle_s=0.0 if n < 4 else 0.5)  # 4 quick answers, then ~100 s each

    server.chat = chat
    proc = start_regenerate(server.url, data, out, "1", stderr=subprocess.PIPE)
    wait_rows(out, 4)
    assert fifth.wait(30), "the fifth request never came"
    time.sleep(0.3)  # the fifth answer is now trickling
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    record("ctrl-c-mid-request", proc.returncode, err, True)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines() == [f"interrupted: 4 rows kept in {out}, rerun to continue"]
    assert took < 2.5, f"Ctrl-C took {took:.1f} s to end the run"
    server.chat = lambda body: as_json(completion("z"))
    assert cli(regen(server.url, data, out)) == 0
    assert sorted(r["index"] for r in rows_of(out)) == list(range(40))
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert [r["counts"].get("interrupted", False) for r in meta["runs"]] == [True, False]


def test_a_killed_run_loses_no_row_and_keeps_none_twice(server, tmp_path):
    data, out = chats(tmp_path / "in.jsonl", 30), tmp_path / "out.jsonl"
    server.chat = lambda body: Reply(200, json.dumps(completion("w" * 50)).encode(), trickle_s=0.002)
    proc = start_regenerate(server.url, data, out, "3", stderr=subprocess.DEVNULL)
    wait_rows(out, 6)
    proc.kill()
    proc.wait()
    with out.open("a") as f:  # and the half-written line a kill inside a write leaves
        f.write('{"index": 29, "messages": [{"role": "assis')
    kept = [json.loads(line)["index"] for line in out.read_text().splitlines()[:-1]]
    assert cli(regen(server.url, data, out)) == 0
    indices = [r["index"] for r in rows_of(out)]
    assert indices[: len(kept)] == kept  # the rows a killed run wrote are kept as they were
    assert sorted(indices) == list(range(30))  # every conversation once


# ---- what the user passes: refused in one line, nothing that existed changed ------------------------------------

INPUT_FAULTS: dict[str, tuple[Callable[[Path, Path, str], list[str]], str]] = {
    "out-is-the-input-file": (
        lambda tmp, data, url: regen(url, data, data),
        "in.jsonl is the input --data file; name a new file for the output",
    ),
    "out-is-another-dataset": (
        lambda tmp, data, url: regen(url, data, _unterminated(tmp / "other.jsonl")),
        "other.jsonl exists and is not a regenerate output",
    ),
    "out-is-a-directory": (
        lambda tmp, data, url: regen(url, data, tmp),
        "is a directory; name the .jsonl file to write",
    ),
    "timeout-inf": (
        lambda tmp, data, url: [*regen(url, data, tmp / "o.jsonl"), "--timeout", "inf"],
        "--timeout inf: expected seconds per request, > 0 and at most 86400",
    ),
    "timeout-nan": (
        lambda tmp, data, url: [*regen(url, data, tmp / "o.jsonl"), "--timeout", "nan"],
        "--timeout nan: expected seconds per request",
    ),
    "meta-empty": (
        lambda tmp, data, url: regen(url, data, _with_meta(tmp, "")),
        "out.jsonl.meta.json is not a regenerate meta file (it is empty)",
    ),
    "meta-not-an-object": (
        lambda tmp, data, url: regen(url, data, _with_meta(tmp, "[]")),
        "out.jsonl.meta.json is not a regenerate meta file (no sampling, target, data settings in it)",
    ),
    "endpoint-not-listening": (
        lambda tmp, data, url: [*regen("http://127.0.0.1:9/v1", data, tmp / "o.jsonl"), "--retries", "0"],
        "did not answer after 0 retries (ConnectionRefusedError: Connection refused); is the server running?",
    ),
    "endpoint-not-a-url": (
        lambda tmp, data, url: regen("127.0.0.1:8000", data, tmp / "o.jsonl"),
        "expected an http:// or https:// URL",
    ),
}


def _unterminated(path: Path) -> Path:
    path.write_text('{"messages": [{"role": "user", "content": "keep me"}]}')  # no final newline
    return path


def _with_meta(tmp: Path, text: str) -> Path:
    out = tmp / "out.jsonl"
    out.write_text('{"index": 0, "messages": []}\n')
    out.with_name("out.jsonl.meta.json").write_text(text)
    return out


@pytest.mark.parametrize("case", list(INPUT_FAULTS))
def test_a_bad_input_is_one_line_and_changes_nothing(case, server, tmp_path, capsys):
    data = chats(tmp_path / "in.jsonl", 3)
    argv = INPUT_FAULTS[case][0](tmp_path, data, server.url)
    code, err, unchanged = run_case(argv, capsys, tmp_path)
    check_one_line(case, code, err, INPUT_FAULTS[case][1], unchanged)
    assert server.asked == []  # refused before a single request


def _edit_data(server: FakeOpenAI, data: Path) -> list[str]:
    chats(data, 6, prefix="edited")  # new content at the same path
    return []


def _serve_other_weights(server: FakeOpenAI, data: Path) -> list[str]:
    server.models = lie(as_json({"data": [{"id": "fake", "root": "/weights/v2"}]}))  # same name
    return []


RESUME_FAULTS: dict[str, tuple[Callable[[FakeOpenAI, Path], list[str]], str]] = {
    "resume-data-edited-in-place": (
        _edit_data,
        "the data's content changed: its first 6 conversations are not the ones this output answers",
    ),
    "resume-other-weights-same-name": (
        _serve_other_weights,
        "the served model differs (root '/weights/fake-v1' -> '/weights/v2')",
    ),
    "resume-other-sampling": (
        lambda s, data: ["--temperature", "0.2"],
        "the sampling differs (temperature 0.8 -> 0.2)",
    ),
    "resume-fewer-samples": (
        lambda s, data: ["--max-samples", "2"],
        "the data has 2 conversations but this output was started with 6",
    ),
}


@pytest.mark.parametrize("case", list(RESUME_FAULTS))
def test_a_resume_that_would_mix_prompts_models_or_sampling_is_refused(case, server, tmp_path, capsys):
    data, out = chats(tmp_path / "in.jsonl", 6), tmp_path / "out.jsonl"
    assert cli(regen(server.url, data, out)) == 0
    capsys.readouterr()
    extra = RESUME_FAULTS[case][0](server, data)
    outputs = [p for p in tmp_path.iterdir() if p.name.startswith("out.jsonl")]
    before = {p: p.read_bytes() for p in outputs}
    code, err = run_cli([*regen(server.url, data, out), *extra], capsys)
    check_one_line(case, code, err, RESUME_FAULTS[case][1], {p: p.read_bytes() for p in outputs} == before)


def test_a_full_disk_names_the_filesystem_that_filled_and_the_rerun_completes(server, tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        data, out = chats(tmp_path / "in.jsonl", 60), disk / "out.jsonl"
        server.chat = lambda body: as_json(completion("v" * 2000))  # ~2 KB a row: 64 KB holds about 30
        code, err = run_cli([*regen(server.url, data, out), "--concurrency", "1"], capsys)
        check_one_line("disk-full-mid-run", code, err, f"no space left on the filesystem mounted at {disk}, ")
        assert f"while writing {out}" in err
        kept = len(out.read_bytes().split(b"\n")) - 1
        assert 10 < kept < 60
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        assert cli(regen(server.url, data, out)) == 0
        assert sorted(r["index"] for r in rows_of(out)) == list(range(60))
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
