"""What `data regenerate --endpoint` itself costs: conversations per second against a server that answers at
once (tests/reliability/fake_openai.py in this process), so the figure is the client's (HTTP, threads, JSON,
the output files), never the model's. Run against another checkout with `--src` to compare two revisions.

    python -m bench.regen_client_overhead [--conversations 1500] [--concurrency 16] [--src OTHER/src]

Feeds docs/BENCHMARKS.md, "Data you can trust".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reliability"))

from fake_openai import FakeOpenAI  # noqa: E402  (a test helper, found on the path set above)


def measure(src: Path, conversations: int, concurrency: int) -> float:
    """Conversations per second of one `draftsmith data regenerate --endpoint` process (its start included)."""
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "in.jsonl"
        rows = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(conversations)]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        argv = [
            sys.executable,
            "-m",
            "draftsmith.scripts.cli",
            "data",
            "regenerate",
            "--endpoint",
            server.url,
        ]
        argv += ["--data", str(data), "--out", str(Path(tmp) / "out.jsonl"), "--no-progress"]
        argv += ["--concurrency", str(concurrency)]
        start = time.perf_counter()
        subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(src)}, check=True, capture_output=True)
        return conversations / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.regen_client_overhead", description=__doc__)
    p.add_argument("--conversations", type=int, default=1500)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--src", type=Path, default=REPO / "src", help="the package sources to run (default: here)"
    )
    args = p.parse_args(argv)
    rate = measure(args.src, args.conversations, args.concurrency)
    print(
        f"{args.src}: {rate:.0f} conversations/s ({args.conversations} one-turn conversations, concurrency "
        f"{args.concurrency}, process start included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
