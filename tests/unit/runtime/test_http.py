"""runtime/http.py against a local server: JSON and text bodies, retries on 5xx, a 4xx refused at once with
the server's own message, and an unreachable server reported after the retries."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftsmith.runtime import http
from draftsmith.runtime.http import HttpClient, RequestRejected, ServerUnavailable, error_message


class _Handler(BaseHTTPRequestHandler):
    answers: list[tuple[int, bytes]] = []
    seen: list[tuple[str, str, str | None, bytes]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        status, payload = self.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch) -> Iterator[str]:
    monkeypatch.setattr(http, "BACKOFF_S", (0.001, 0.002))
    _Handler.answers, _Handler.seen = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_json_and_text_bodies_with_the_key(server):
    _Handler.answers = [(200, b'{"ok": 1}'), (200, b"vllm_x_total 3\n")]
    client = HttpClient(server, api_key="sk-1")
    assert client.request("POST", "/chat", {"q": 1}) == {"ok": 1}
    assert client.get_text("/metrics") == "vllm_x_total 3\n"
    assert _Handler.seen[0] == ("POST", "/v1/chat", "Bearer sk-1", b'{"q": 1}')
    assert _Handler.seen[1][:2] == ("GET", "/v1/metrics")


def test_a_5xx_is_retried_and_a_4xx_is_refused_at_once(server):
    _Handler.answers = [(503, b"busy"), (502, b""), (200, b'{"ok": 2}')]
    assert HttpClient(server, retries=2).request("GET", "/models") == {"ok": 2}
    assert len(_Handler.seen) == 3
    _Handler.answers = [(400, b'{"error": {"message": "prompt too long"}}')]
    with pytest.raises(RequestRejected, match="HTTP 400: prompt too long"):
        HttpClient(server, retries=3).request("POST", "/chat", {})
    assert len(_Handler.seen) == 4  # not retried
    _Handler.answers = [(503, b"busy")] * 2
    with pytest.raises(
        ServerUnavailable, match=r"/v1/models did not answer after 1 retries \(HTTP 503: busy\)"
    ):
        HttpClient(server, retries=1).request("GET", "/models")


def test_an_unreachable_server_is_unavailable():
    with pytest.raises(ServerUnavailable, match="did not answer after 0 retries"):
        HttpClient("http://127.0.0.1:9", timeout_s=2, retries=0).request("GET", "/models")


def test_error_messages_are_read_from_openai_style_bodies():
    assert error_message(json.dumps({"error": {"message": "bad key"}})) == "bad key"
    assert error_message(json.dumps({"detail": "x"})) == "x"  # FastAPI's error body
    assert (
        error_message("  <html><title>502 Bad Gateway</title></html> ") == "an HTML page ('502 Bad Gateway')"
    )
    assert error_message("plain words") == "plain words"


def test_the_deadline_covers_the_whole_answer_and_abort_ends_a_request_at_once():
    import time

    from fake_openai import FakeOpenAI, Reply

    from draftsmith.runtime.http import Aborted, ProtocolError

    with FakeOpenAI() as srv:
        srv.models = lambda body: Reply(200, b'{"data": []}' + b" " * 200, trickle_s=0.02)  # about 4 s in all
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match=r"no complete answer within the 0.5 s deadline"):
            HttpClient(srv.url, timeout_s=0.5, retries=0).request("GET", "/models")
        assert time.monotonic() - start < 2
        client = HttpClient(srv.url, timeout_s=60, retries=0)
        threading.Timer(0.3, client.abort).start()
        start = time.monotonic()
        with pytest.raises(Aborted):
            client.request("GET", "/models")
        assert time.monotonic() - start < 2
        srv.models = lambda body: Reply(200, b"[1, 2]")
        with pytest.raises(
            ProtocolError, match=r"answered 200 application/json with JSON that is not an object"
        ):
            HttpClient(srv.url, retries=3).request("GET", "/models")  # not retried: something else answers


def test_an_abort_before_the_connection_has_a_socket_still_ends_the_request(monkeypatch):
    """The window the Ctrl-C test once fell into under load: abort() ran after a request registered its
    connection but before that connection opened its socket (nothing to shut), and the request then trickled
    to its end. Here abort() runs at exactly that moment, every time."""
    import http.client
    import time

    from fake_openai import FakeOpenAI, Reply

    from draftsmith.runtime.http import Aborted

    with FakeOpenAI() as srv:
        srv.models = lambda body: Reply(200, b'{"data": []}' + b" " * 200, trickle_s=0.05)  # about 10 s
        client = HttpClient(srv.url, timeout_s=60, retries=0)
        connect = http.client.HTTPConnection.connect

        def aborted_then_connected(conn: http.client.HTTPConnection) -> None:
            client.abort()  # finds the connection registered, with no socket yet
            connect(conn)

        monkeypatch.setattr(http.client.HTTPConnection, "connect", aborted_then_connected)
        start = time.monotonic()
        with pytest.raises(Aborted):
            client.request("GET", "/models")
        assert time.monotonic() - start < 2
