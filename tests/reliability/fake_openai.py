"""An OpenAI-compatible server in the test's process that misbehaves on cue: it can refuse (any status, any
body), trickle (its answer a few bytes at a time), lie (a 200 that is not a completion: other JSON, an HTML page,
bytes that are not UTF-8, content-part lists, a malformed model list) and die (close the connection without an
answer, or stop listening). By default it is a well-behaved chat model that answers `answer to: <last user
text>`, and it counts what it was asked.

    with FakeOpenAI() as server:
        server.chat = refuse(401, {"error": {"message": "Invalid API key"}})
        ... draftsmith data regenerate --endpoint server.url ...
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server sends: a status, a body, its Content-Type; `trickle_s` > 0 sends the body one byte per
    that many seconds; `hang_up` closes the connection without any answer."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    trickle_s: float = 0.0
    hang_up: bool = False


Script = Callable[[dict[str, Any]], Reply]  # a request's JSON body -> the reply


def as_json(payload: Any, status: int = 200, **kw: Any) -> Reply:
    return Reply(status, json.dumps(payload).encode(), **kw)


def completion(text: Any) -> dict[str, Any]:
    """A chat completion whose message content is `text` (a string, or content parts to lie with)."""
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }


def answer(body: dict[str, Any]) -> Reply:
    """The well-behaved answer: `answer to: <last user text>`."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return as_json(completion(f"answer to: {user}"))


def refuse(status: int, payload: Any) -> Script:
    return lambda body: as_json(payload, status)


def lie(reply: Reply) -> Script:
    return lambda body: reply


MODELS = {"object": "list", "data": [{"id": "fake", "root": "/weights/fake-v1", "max_model_len": 4096}]}


class FakeOpenAI(ThreadingHTTPServer):
    """The server; `models` and `chat` are the scripts of `GET /v1/models` and `POST /v1/chat/completions`."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.models: Script = lambda body: as_json(MODELS)
        self.chat: Script = answer
        self.asked: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.die()

    def die(self) -> None:
        """Stop listening: every later request finds nothing there."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._send(
            self.server.models({}) if self.path.endswith("/models") else Reply(404, b'{"detail":"Not Found"}')
        )

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with self.server.lock:
            self.server.asked.append(body)
        if not self.path.endswith("/chat/completions"):
            self._send(Reply(404, b'{"detail":"Not Found"}'))
            return
        self._send(self.server.chat(body))

    def _send(self, reply: Reply) -> None:
        if reply.hang_up:
            self.close_connection = True
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        try:
            if reply.trickle_s <= 0:
                self.wfile.write(reply.body)
                return
            for byte in reply.body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(reply.trickle_s)
        except OSError:  # the client gave up (its deadline, Ctrl-C): nothing more to send
            self.close_connection = True
