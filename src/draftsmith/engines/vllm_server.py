"""vLLM's OpenAI-compatible server, started from the engine's venv (the tests and benchmarks of
`data regenerate --endpoint`; users run their own server).

    with serve(require_env("vllm"), model_dir, log=Path("vllm-server.log")) as server:
        ... server.url ...   # http://127.0.0.1:<free port>/v1, answering once the model is loaded

The server runs in a process group of its own, so `kill()` takes its engine-core process with it, as a crash or
an OOM kill would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.http import HttpClient, RequestRejected, ServerUnavailable

from .setup import EngineEnv
from .vllm_engine import last_error, worker_env

START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server: its process, its API root and its log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill(self) -> None:
        """SIGKILL the server and its engine core (no clean shutdown: what a crash looks like to clients)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def ready(self) -> bool:
        try:
            return bool(HttpClient(self.url, timeout_s=5, retries=0).request("GET", "/models").get("data"))
        except (ServerUnavailable, RequestRejected):
            return False


@contextmanager
def serve(
    engine: EngineEnv,
    model: Path,
    log: Path,
    name: str = "target",
    max_model_len: int = 4096,
    extra: Sequence[str] = (),
    enforce_eager: bool = True,
    dtype: str = "float32",
) -> Iterator[Server]:
    """Serve `model` in `dtype` (float32 unless asked: bfloat16 on the CPU is not batch-invariant; eager unless
    `enforce_eager` is False: torch.compile takes a minute more to start) on 127.0.0.1 under the name `name`
    until the block ends."""
    port = free_port()
    cmd = [
        *(str(engine.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(port), "--served-model-name", name),
        *("--dtype", dtype, "--max-model-len", str(max_model_len), *extra),
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=worker_env(engine), start_new_session=True
        )
    server = Server(process, f"http://127.0.0.1:{port}/v1", log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.ready():
            if process.poll() is not None:
                raise UserError(
                    f"vLLM's server exited ({process.returncode}): {last_error(log)} (log: {log})"
                )
            if time.monotonic() > deadline:
                raise UserError(f"vLLM's server did not answer within {START_TIMEOUT_S} s (log: {log})")
            time.sleep(1)
        yield server
    finally:
        server.kill()
