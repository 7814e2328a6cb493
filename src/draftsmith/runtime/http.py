"""The one HTTP client: JSON (or text) over the standard library, with a deadline per request and bounded
retries. The OpenAI-compatible regeneration client (data/endpoint.py), vLLM's readiness poll and its metrics
(engines/) all speak through it; the engine runs elsewhere, so nothing here needs more than http.client.

What a request can meet, and what the client does:

- the server is unreachable, misses the deadline, or answers 408 / 429 / 5xx: retried `retries` times with
  exponential backoff; then `ServerUnavailable`;
- any other status (a 4xx, a redirect): `RequestRejected` with the URL, the status and the server's own message
  (the `error.message` of an OpenAI-style body; an HTML page is named as one, with its title);
- a 2xx whose body is not what was asked for (not UTF-8, not JSON, JSON that is not an object):
  `ProtocolError`, not retried: something other than the expected server answers at that address.

`timeout_s` is a deadline for the whole request (connecting, sending, the status line, every byte of the body):
a server that trickles its answer a byte at a time is cut off at the deadline like one that says nothing.
`abort()` (Ctrl-C, another request's fatal error) ends every request in flight at once and stops retries.

Written on http.client rather than urllib: urllib's timeout bounds each socket read, not the request, and a
request blocked in a read cannot be ended from another thread. Proxy environment variables are not read (the
server is a serving engine the user runs, normally on the same network).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = (0.5, 16.0)  # first wait and the longest one
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


class ServerUnavailable(RuntimeError):
    """The server did not answer after every retry."""


class RequestRejected(RuntimeError):
    """The server refused this request (a status other than 2xx, 408, 429 and 5xx), with its reason."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ProtocolError(RequestRejected):
    """The server answered 2xx with a body that is not the JSON object (or text) asked for."""


class Aborted(RuntimeError):
    """The request was ended by `HttpClient.abort()` (the run is stopping)."""


@dataclass
class HttpClient:
    """Requests to `base` (a URL prefix such as `http://127.0.0.1:8000/v1`), each with a deadline of
    `timeout_s` seconds and `retries` retries; `stop`, once set, gives up instead of retrying, and `abort()`
    also ends the requests in flight."""

    base: str
    api_key: str | None = None
    timeout_s: float = 600.0
    retries: int = 4
    stop: threading.Event = field(default_factory=threading.Event)
    _open: set[http.client.HTTPConnection] = field(default_factory=set, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON object the server answers to `method path` with `body` as JSON (see the module for what
        is retried and what is raised)."""
        return dict(self._send(method, path, body, _json_object))

    def get_text(self, path: str) -> str:
        """The body of `GET path` as text (e.g. Prometheus metrics)."""
        return str(self._send("GET", path, None, _text))

    def abort(self) -> None:
        """Stop: no more retries, and every request in flight ends now (raising `Aborted`)."""
        self.stop.set()
        with self._lock:
            for conn in list(self._open):
                _shut(conn)

    def _send(
        self, method: str, path: str, body: dict[str, Any] | None, parse: Callable[[bytes, str], Any]
    ) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt and self.stop.wait(min(BACKOFF_S[0] * 2 ** (attempt - 1), BACKOFF_S[1])):
                break  # stop.wait returns True once the run is stopping: no more retries
            if self.stop.is_set():
                raise Aborted(f"{self.base}{path}: the run is stopping")
            try:
                status, kind, raw = self._exchange(method, self.base + path, data, headers)
            except (OSError, http.client.HTTPException) as err:
                problem = _transport_problem(err, self.timeout_s)
                continue
            if 200 <= status < 300:
                return parse(raw, f"{self.base}{path} answered {status} {kind or 'with no Content-Type'}")
            text = raw.decode(errors="replace")
            problem = f"HTTP {status}: {error_message(text)}"
            if status not in RETRY_STATUS:
                raise RequestRejected(f"{self.base}{path}: {problem}", status)
        if self.stop.is_set():
            raise Aborted(f"{self.base}{path}: the run is stopping")
        raise ServerUnavailable(f"{self.base}{path} did not answer after {self.retries} retries ({problem})")

    def _exchange(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        """One request and its whole answer (status, Content-Type, body), or an OSError at the deadline."""
        parts = urllib.parse.urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname or "", parts.port, timeout=self.timeout_s)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _shut(conn)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        with self._lock:
            self._open.add(conn)
        timer.start()
        try:
            # Connected here, then `stop` checked: `abort()` sets `stop` before it shuts the open sockets, so
            # an abort that came before this connection had a socket is seen now, and any later one shuts it.
            # (A lazy connect inside `request` left that window open: the request then ran to its end.)
            conn.connect()
            if self.stop.is_set():
                raise Aborted(f"{url}: the run is stopping")
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, response.getheader("Content-Type", ""), raw
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set():
                raise TimeoutError(f"no complete answer within the {self.timeout_s:g} s deadline") from err
            if self.stop.is_set():
                raise Aborted(f"{url}: the run is stopping") from None
            raise
        finally:
            timer.cancel()
            with self._lock:
                self._open.discard(conn)
            conn.close()


def _shut(conn: http.client.HTTPConnection) -> None:
    """End a connection from another thread: a read blocked on it returns at once."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


def _transport_problem(err: BaseException, timeout_s: float) -> str:
    if isinstance(err, TimeoutError):
        return str(err) if "deadline" in str(err) else f"no answer within the {timeout_s:g} s deadline"
    reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return f"{type(err).__name__}: {reason}"


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{what} whose body is not UTF-8 text (byte {err.start})", 200) from None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    text = _text(raw, what)
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        raise ProtocolError(f"{what} that is not JSON: {describe_body(text)}", 200) from None
    if not isinstance(answer, dict):
        raise ProtocolError(f"{what} with JSON that is not an object: {text.strip()[:120]}", 200)
    return answer


def describe_body(text: str) -> str:
    """A body in a few words: an HTML page by its title (a proxy's or a web server's page), else its start."""
    if "<html" in text[:1000].lower() or text.lstrip()[:15].lower().startswith("<!doctype"):
        title = _TITLE.search(text)
        return f"an HTML page ({title.group(1).strip()[:80]!r})" if title else "an HTML page"
    start = " ".join(text.split())[:120]
    return repr(start) if start else "an empty body"


def error_message(text: str) -> str:
    """The server's message in an error body: `error.message` of an OpenAI-style JSON body (or `detail`,
    FastAPI's), an HTML page by its title, else the text."""
    try:
        err = json.loads(text)
    except json.JSONDecodeError:
        return describe_body(text) if "<" in text[:200] else text.strip()[:300]
    inner = err.get("error", err.get("detail", err)) if isinstance(err, dict) else err
    return str(inner.get("message", inner) if isinstance(inner, dict) else inner)[:300]
