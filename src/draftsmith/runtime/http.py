"""The one HTTP client: JSON (or text) over the standard library, with a per-request timeout and bounded
retries. The OpenAI-compatible regeneration client (data/endpoint.py), vLLM's readiness poll and its metrics
(engines/) all speak through it; the engine runs elsewhere, so nothing here needs more than urllib.

What a request can meet, and what the client does:

- the server is unreachable, times out, or answers 408 / 429 / 5xx: retried `retries` times with exponential
  backoff; then `ServerUnavailable`;
- any other 4xx: `RequestRejected` with the server's own message (the `error.message` of an OpenAI-style body).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = (0.5, 16.0)  # first wait and the longest one


class ServerUnavailable(RuntimeError):
    """The server did not answer after every retry."""


class RequestRejected(RuntimeError):
    """The server refused this request (a 4xx other than 408 / 429), with its reason."""


@dataclass
class HttpClient:
    """Requests to `base` (a URL prefix such as `http://127.0.0.1:8000/v1`), `timeout_s` per request and
    `retries` retries; `stop`, once set, gives up instead of retrying (Ctrl-C, another request's fatal error)."""

    base: str
    api_key: str | None = None
    timeout_s: float = 600.0
    retries: int = 4
    stop: threading.Event = field(default_factory=threading.Event)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON object the server answers to `method path` with `body` as JSON (retried, see the module;
        a body that is not JSON counts as no answer)."""
        return dict(self._send(method, path, body, json.loads))

    def get_text(self, path: str) -> str:
        """The body of `GET path` as text (e.g. Prometheus metrics)."""
        return str(self._send("GET", path, None, bytes.decode))

    def _send(
        self, method: str, path: str, body: dict[str, Any] | None, parse: Callable[[bytes], Any]
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                if self.stop.is_set():
                    break
                time.sleep(min(BACKOFF_S[0] * 2 ** (attempt - 1), BACKOFF_S[1]))
            request = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return parse(response.read())
            except urllib.error.HTTPError as err:
                text = err.read().decode(errors="replace")
                if err.code not in RETRY_STATUS:
                    raise RequestRejected(f"HTTP {err.code}: {error_message(text)}") from None
                problem = f"HTTP {err.code}: {error_message(text)}"
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
                problem = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise ServerUnavailable(f"{self.base}{path} did not answer after {self.retries} retries ({problem})")


def error_message(text: str) -> str:
    """The server's message in an error body: `error.message` of an OpenAI-style JSON body, else the text."""
    try:
        err = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:300]
    inner = err.get("error", err) if isinstance(err, dict) else err
    return str(inner.get("message", inner) if isinstance(inner, dict) else inner)[:300]
