"""`data regenerate --endpoint` against an OpenAI-compatible server in this process (the standard library's HTTP
server playing vLLM): turns conditioned on the model's own answers, tool calls kept and matched, reasoning kept,
retries, refused requests recorded, concurrency bounded, a server that dies loses nothing on rerun. The same
against vLLM itself is in tests/recipes/test_regenerate_vllm.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftsmith.data import endpoint
from draftsmith.data.conversations import read_conversations
from draftsmith.runtime import http
from draftsmith.runtime.errors import UserError
from draftsmith.scripts.data.regenerate import parse_args, regenerate

CALL = {"name": "search_recipes", "arguments": {"ingredients": ["rice"]}}
NO_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class FakeServer(ThreadingHTTPServer):
    """Answers like a chat model: `answer <n> to: <last user text>`, n = the assistant turns it was shown."""

    def __init__(self, parser: bool = True, reasoning: bool = False, fail_first: int = 0, die_after: int = 0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.parser, self.reasoning, self.fail_first, self.die_after = (
            parser,
            reasoning,
            fail_first,
            die_after,
        )
        self.requests: list[dict] = []
        self.headers_seen: list[str | None] = []
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.delay = 0.0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def answer(self, body: dict) -> tuple[int, dict]:
        messages = body["messages"]
        last = messages[-1]
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        if "TOO LONG" in user:
            return 400, {"error": {"message": "This model's maximum context length is 1024 tokens"}}
        if body.get("tools") and body.get("tool_choice") == "auto" and not self.parser:
            return 400, {"error": {"message": NO_PARSER}}
        message: dict = {"role": "assistant", "content": None}
        if last["role"] == "tool":
            message["content"] = "used: " + last["content"]
        elif "CALL" in user and body.get("tools"):
            args = {"ingredients": ["rice" if "CALL rice" in user else "bread"]}
            if self.parser and body.get("tool_choice") == "auto":
                arguments = json.dumps(args)
                message["tool_calls"] = [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": CALL["name"], "arguments": arguments},
                    }
                ]
            else:
                message["content"] = json.dumps({"name": CALL["name"], "arguments": args})
        else:
            shown = sum(m["role"] == "assistant" for m in messages)
            message["content"] = f"answer {shown} to: {user}"
        if self.reasoning:
            message["reasoning"] = f"thinking about {user}"
        words = len(str(message["content"]).split())
        finish = "length" if words >= body["max_tokens"] else "stop"
        usage = {
            "prompt_tokens": len(json.dumps(messages)) // 10,
            "completion_tokens": min(words, body["max_tokens"]),
        }
        return 200, {"choices": [{"message": message, "finish_reason": finish}], "usage": usage}


class Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, *args) -> None:
        pass

    def reply(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply(200, {"data": [{"id": "fake", "max_model_len": 1024}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append(body)
            server.headers_seen.append(self.headers.get("Authorization"))
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            failing = server.fail_first > 0
            server.fail_first -= failing
            dead = server.die_after and len(server.requests) > server.die_after
        try:
            if dead:  # the process is gone: the connection closes without an answer
                self.close_connection = True
                return
            time.sleep(server.delay)
            self.reply(*((503, {"error": {"message": "overloaded"}}) if failing else server.answer(body)))
        finally:
            with server.lock:
                server.in_flight -= 1


@pytest.fixture
def server():
    made: list[FakeServer] = []

    def make(**kwargs) -> FakeServer:
        made.append(FakeServer(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.stop()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", (0.01, 0.02))


def write_data(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(url: str, data: str, out, *extra: str) -> dict:
    args = ["--endpoint", url, "--data", data, "--out", str(out), "--no-progress", "--max-new-tokens", "50"]
    return regenerate(parse_args([*args, *extra]))


def two_turn_chats(n: int) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": "DATASET ANSWER"},
                {"role": "user", "content": f"follow-up {i}"},
                {"role": "assistant", "content": "DATASET ANSWER"},
            ],
            "category": "writing",
        }
        for i in range(n)
    ]


def test_every_user_turn_is_answered_after_the_models_own_answers(server, tmp_path):
    srv = server()
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(3))
    out = tmp_path / "out.jsonl"
    began = time.perf_counter()
    counts = run(srv.url, data, out, "--temperature", "0", "--seed", "5")
    assert 0 < counts["seconds"] <= time.perf_counter() - began
    assert {k: counts[k] for k in ("input", "written", "failed", "skipped", "answers")} == {
        "input": 3,
        "written": 3,
        "failed": 0,
        "skipped": 0,
        "answers": 6,
    }
    rows = sorted((json.loads(line) for line in out.open()), key=lambda r: r["index"])
    for i, row in enumerate(rows):
        assert row["messages"] == [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer 0 to: question {i}"},
            {"role": "user", "content": f"follow-up {i}"},
            {
                "role": "assistant",
                "content": f"answer 1 to: follow-up {i}",
            },  # shown its own answer, not the data's
        ]
        assert row["category"] == "writing"
    assert all("DATASET ANSWER" not in json.dumps(r["messages"]) for r in srv.requests)
    by_seed = {r["seed"]: r for r in srv.requests}  # the seed is a function of (conversation, turn) only
    assert sorted(by_seed) == sorted(5 * 1_000_003 + i * 1_009 + t for i in range(3) for t in range(2))
    assert all(r["temperature"] == 0 and r["max_tokens"] == 50 and r["model"] == "fake" for r in srv.requests)
    words = [len(m["content"].split()) for r in rows for m in r["messages"] if m["role"] == "assistant"]
    assert counts["completion_tokens"] == sum(words) and counts["truncated"] == 0
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert meta["target"] == {"served_model": "fake"} and meta["endpoint"] == srv.url
    assert meta["counts"] == counts and meta["server"]["max_model_len"] == 1024


def glaive(call_args: list[str]) -> dict:
    """A tool-call chat in ShareGPT form (LLaMA-Factory's glaive_toolcall), tools as bare schemas."""
    recorded = {"name": CALL["name"], "arguments": {"ingredients": call_args}}
    tool = {
        "name": CALL["name"],
        "parameters": {"type": "object", "properties": {"ingredients": {"type": "array"}}},
    }
    return {
        "conversations": [
            {"from": "human", "value": "CALL rice please"},
            {"from": "function_call", "value": json.dumps(recorded)},
            {"from": "observation", "value": '{"recipes": ["fried rice"]}'},
            {"from": "gpt", "value": "DATASET ANSWER"},
            {"from": "human", "value": "thanks"},
            {"from": "gpt", "value": "DATASET ANSWER"},
        ],
        "tools": json.dumps([tool]),
    }


@pytest.mark.parametrize("parser", [True, False], ids=["server-parses-calls", "calls-as-text"])
def test_a_matching_tool_call_keeps_the_recorded_result(server, tmp_path, parser):
    srv = server(parser=parser)
    data = write_data(tmp_path / "in.json", [glaive(["rice"])])
    out = tmp_path / "out.jsonl"
    counts = run(srv.url, data, out)
    assert counts["written"] == 1 and counts["answers"] == 3 and counts["tool_call_differs"] == 0
    messages = json.loads(out.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    call = messages[1]
    if parser:  # the server's structured call, kept in OpenAI form, and the result answers its id
        assert call["tool_calls"][0]["function"]["name"] == CALL["name"] and call["content"] == ""
        assert messages[2]["tool_call_id"] == "call_7"
    else:  # vLLM without a tool parser refuses tool_choice=auto: asked again with none, the call is text
        assert json.loads(call["content"]) == CALL and "tool_calls" not in call
    assert messages[2]["content"] == '{"recipes": ["fried rice"]}'
    assert messages[3]["content"] == 'used: {"recipes": ["fried rice"]}'
    assert messages[5]["content"] == "answer 2 to: thanks"
    assert srv.requests[0]["tools"][0] == {"type": "function", "function": json.loads(glaive([])["tools"])[0]}
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert meta["tool_choice"] == ("auto" if parser else "none")
    back = read_conversations(str(out))[0]  # the loader keeps what the server returned
    assert back.messages == messages and back.tools == json.loads(glaive([])["tools"])


def test_a_different_tool_call_ends_the_conversation_at_the_models_call(server, tmp_path):
    srv = server()
    data = write_data(
        tmp_path / "in.json", [glaive(["chicken"])]
    )  # the recorded call differs from the model's
    out = tmp_path / "out.jsonl"
    counts = run(srv.url, data, out)
    assert counts["written"] == 1 and counts["answers"] == 1 and counts["tool_call_differs"] == 1
    messages = json.loads(out.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] and "tool_calls" in messages[1]


def test_reasoning_is_kept_where_the_template_renders_it(server, tmp_path, toy_tokenizer):
    from draftsmith.data.chat_render import render_conversation

    srv = server(reasoning=True)
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(1))
    out = tmp_path / "out.jsonl"
    run(srv.url, data, out)
    messages = json.loads(out.read_text())["messages"]
    assert messages[3]["reasoning_content"] == "thinking about follow-up 0"
    tokenizer = toy_tokenizer
    template = (  # Qwen3's rule, reduced: the thinking of the answers after the last user turn is rendered
        "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content and loop.index0 > 2 %}<think>"
        "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    saved = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        sample = render_conversation(tokenizer, read_conversations(str(out))[0])
    finally:
        tokenizer.chat_template = saved
    trained = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
    trained = trained.replace(" ", "")  # the toy tokenizer decodes with spaces of its own
    assert "<think>thinkingaboutfollow-up0</think>answer1to:follow-up0" in trained
    assert "thinkingaboutquestion0" not in trained  # the template drops earlier thinking, as when serving


def test_retries_then_refusals_are_recorded_and_counts_add_up(server, tmp_path):
    srv = server(fail_first=3)  # three 503s: retried (4 retries allowed)
    rows = two_turn_chats(2) + [{"messages": [{"role": "user", "content": "TOO LONG"}]}]
    rows.append({"messages": [{"role": "assistant", "content": "no question"}]})
    data = write_data(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    counts = run(srv.url, data, out, "--concurrency", "1")
    assert (counts["written"], counts["failed"], counts["skipped"]) == (2, 2, 0)
    failed = {
        f["index"]: f["reason"] for f in map(json.loads, out.with_name("out.jsonl.failed.jsonl").open())
    }
    assert "maximum context length is 1024" in failed[2] and failed[2].startswith(
        f"the server refused it: {srv.url}/chat/completions: HTTP 400"
    )
    assert "no user turn" in failed[3]
    assert len(srv.requests) == 3 + 4 + 1  # three refused, four answered, one refused for good
    assert run(srv.url, data, out)["skipped"] == 4  # failures are not asked again


def test_requests_in_flight_stay_within_the_concurrency(server, tmp_path):
    srv = server()
    srv.delay = 0.2  # long enough that the three requests overlap on a loaded machine
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(9))
    run(srv.url, data, tmp_path / "out.jsonl", "--concurrency", "3")
    assert srv.max_in_flight == 3


def test_a_server_that_dies_mid_run_loses_nothing_on_rerun(server, tmp_path):
    srv = server(die_after=7)
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(10))
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match="rerun the same command to continue"):
        run(srv.url, data, out, "--concurrency", "2", "--retries", "2")
    before = out.read_text()
    assert 1 <= len(before.splitlines()) <= 3 and not out.with_name("out.jsonl.failed.jsonl").read_text()
    again = server()  # restarted, on another port: the endpoint is recorded, not checked
    counts = run(again.url, data, out, "--concurrency", "2")
    assert counts["skipped"] == len(before.splitlines()) and counts["failed"] == 0
    assert out.read_text().startswith(before)
    assert sorted(json.loads(line)["index"] for line in out.open()) == list(range(10))


def test_a_served_dtype_is_part_of_the_targets_identity(server, tmp_path):
    """`--serve` in bfloat16 writes other greedy answers than float32: the dtype it served is checked on
    resume, and float32 (the default) records none, so files written before it was recorded still resume."""
    from draftsmith.scripts.data.regenerate_endpoint import regenerate_via_endpoint

    srv = server()
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(2))
    out = tmp_path / "out.jsonl"
    base = ["--endpoint", srv.url, "--data", data, "--out", str(out), "--no-progress"]
    regenerate_via_endpoint(parse_args([*base, "--max-samples", "1"]), served_dtype="bfloat16")
    meta = json.loads(out.with_name("out.jsonl.meta.json").read_text())
    assert meta["target"]["dtype"] == "bfloat16"
    with pytest.raises(UserError, match=r"the served model differs \(dtype 'bfloat16' -> none\)"):
        regenerate_via_endpoint(parse_args(base))  # float32 now: refused, nothing appended
    assert len(out.read_text().splitlines()) == 1
    counts = regenerate_via_endpoint(parse_args(base), served_dtype="bfloat16")
    assert counts["skipped"] == 1 and counts["written"] == 1
    plain = tmp_path / "plain.jsonl"
    run(srv.url, data, plain)
    assert "dtype" not in json.loads(plain.with_name("plain.jsonl.meta.json").read_text())["target"]


def test_api_key_comes_from_the_named_variable(server, tmp_path, monkeypatch):
    srv = server()
    data = write_data(tmp_path / "in.jsonl", two_turn_chats(1))
    monkeypatch.setenv("MY_KEY", "s3cret")
    run(srv.url, data, tmp_path / "a.jsonl", "--api-key-env", "MY_KEY")
    assert set(srv.headers_seen) == {"Bearer s3cret"}
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(UserError, match="--api-key-env MY_KEY: that environment variable is not set"):
        run(srv.url, data, tmp_path / "b.jsonl", "--api-key-env", "MY_KEY")


def test_bad_invocations_fail_in_one_line(tmp_path, capsys):
    from draftsmith.scripts.cli import main

    data = write_data(tmp_path / "in.jsonl", two_turn_chats(1))
    base = ["data", "regenerate", "--data", data, "--out", str(tmp_path / "o.jsonl")]
    assert main([*base]) == 1
    assert "pass --target DIR (generate here) or --endpoint URL" in capsys.readouterr().err
    assert main([*base, "--endpoint", "http://127.0.0.1:9/v1", "--retries", "0"]) == 1
    err = capsys.readouterr().err
    assert "is the server running?" in err and "Traceback" not in err
    assert main([*base, "--endpoint", "127.0.0.1:8000"]) == 1
    assert "expected an http:// or https:// URL" in capsys.readouterr().err


def test_api_base_accepts_the_common_spellings():
    assert endpoint.api_base("http://h:8000") == "http://h:8000/v1"
    assert endpoint.api_base("http://h:8000/v1/") == "http://h:8000/v1"
    assert endpoint.api_base("http://h:8000/v1/chat/completions") == "http://h:8000/v1"
    assert endpoint.api_base("https://proxy/llm/v1") == "https://proxy/llm/v1"


def test_a_request_carries_its_seed_only_when_seeded(tmp_path):
    """The seed of a request is a function of (conversation, turn); `seeded=False` (`--serve vllm` sampling, whose
    server takes one seed for the run) sends none."""
    from draftsmith.data.regen_output import Sampling
    from draftsmith.scripts.data.regenerate_endpoint import request_body

    conv = read_conversations(str(write_data(tmp_path / "in.jsonl", two_turn_chats(1))), "auto", None)[0]
    sampling = Sampling(0.8, 0.95, 0, 32, 5)
    messages = [{"role": "user", "content": "hi"}]
    seeded = request_body("m", sampling, conv, 3)(messages, 1)
    assert seeded["seed"] == 5 * 1_000_003 + 3 * 1_009 + 1 and seeded["temperature"] == 0.8
    unseeded = request_body("m", sampling, conv, 3, seeded=False)(messages, 1)
    assert "seed" not in unseeded and {k: v for k, v in seeded.items() if k != "seed"} == unseeded
