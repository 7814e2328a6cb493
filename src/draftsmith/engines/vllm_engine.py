"""vLLM as an evaluator: the speculative config of a drafter, a run of the worker in the engine's venv, and
vLLM's counters turned into the figures draftsmith reports.

vLLM's own definitions (vllm/v1/spec_decode/metrics.py, 0.32), over the requests of one run:

    mean acceptance length   1 + accepted / drafts, where `drafts` counts (request, verification step) pairs
                             that carried draft tokens; a step of the n-gram proposer that found no match
                             carries none and is NOT counted (draftsmith's tau counts every step)
    acceptance at position i (steps whose first i drafts were all accepted) / drafts: unconditional
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import user_cache

from .setup import EngineEnv

WORKER = Path(__file__).resolve().parent / "vllm_worker.py"


@dataclass
class VllmRun:
    """What one worker run decoded and counted."""

    version: str
    load_s: float
    outputs: list[dict[str, Any]]  # token_ids, finish_reason, wall_s per prompt
    counters: dict[str, Any]  # num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_position

    @property
    def tokens(self) -> int:
        return sum(len(o["token_ids"]) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float | None:
        wall = sum(o["wall_s"] for o in self.outputs)
        return self.tokens / wall if wall > 0 else None

    @property
    def mean_acceptance_length(self) -> float | None:
        drafts = self.counters["num_drafts"]
        return 1 + self.counters["num_accepted_tokens"] / drafts if drafts else None

    @property
    def acceptance_by_position(self) -> list[float]:
        drafts = self.counters["num_drafts"]
        return [n / drafts for n in self.counters["accepted_per_position"]] if drafts else []


def speculative_config(
    export_info: dict[str, Any] | None,
    export_dir: Path | None,
    depth: int,
    draft_sample_method: str,
    ngram: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The `speculative_config` vLLM starts with: the export's (its `{dir}` filled in), or the n-gram proposer's
    (`ngram` = (min, max) n), drafting `depth` tokens per step."""
    if ngram is not None:
        config: dict[str, Any] = {
            "method": "ngram",
            "prompt_lookup_min": ngram[0],
            "prompt_lookup_max": ngram[1],
        }
    else:
        assert export_info is not None and export_dir is not None
        config = dict(export_info["speculative_config"])
        if "model" in config:
            config["model"] = str(export_dir)
    config["num_speculative_tokens"] = depth
    if draft_sample_method != "greedy":
        config["draft_sample_method"] = draft_sample_method
    return config


def worker_env(engine: EngineEnv) -> dict[str, str]:
    """The worker's environment: a 2 GiB KV cache on the CPU unless set, vLLM's compile cache off (its AOT
    cache never loaded in 0.32 CPU and a recompile after that failed once), vLLM's caches under draftsmith's,
    Intel OpenMP preloaded from the engine's venv (`preload`) and its threads on every core of a 2-core machine
    (`omp_binding`)."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    env.setdefault("VLLM_CACHE_ROOT", str(user_cache() / "engines" / "vllm-cache"))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if "LD_PRELOAD" not in env and (iomp := preload(engine)) is not None:
        env["LD_PRELOAD"] = str(iomp)
    if "VLLM_CPU_OMP_THREADS_BIND" not in env and (cores := omp_binding()) is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return env


# The environment settings that change vLLM's speed on a CPU: engine-eval records them in its report and keys a
# kept plain run (--plain-cache) by them, so runs under other settings are never compared as one
SPEED_SETTINGS = ("VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS")


def speed_settings(engine: EngineEnv) -> dict[str, str | None]:
    """The `SPEED_SETTINGS` the worker runs under (`worker_env`), None where unset."""
    env = worker_env(engine)
    return {k: env.get(k) for k in SPEED_SETTINGS}


def omp_binding(cpus: set[int] | None = None) -> str | None:
    """The CPUs to bind vLLM's OpenMP threads to where its own choice would leave the model one core: vLLM's CPU
    worker ("auto") keeps a core per rank for its scheduler process, which on a 2-core machine is half of it. There
    the threads go on both (the scheduler shares them); measured faster for the server's answers and for
    speculative decoding at batch 1 (docs/BENCHMARKS.md, "vLLM's CPU settings"). With more cores, or a user's own
    VLLM_CPU_OMP_THREADS_BIND, vLLM's choice stands (None)."""
    cpus = os.sched_getaffinity(0) if cpus is None else cpus
    return ",".join(str(c) for c in sorted(cpus)) if len(cpus) == 2 else None


def preload(engine: EngineEnv) -> Path | None:
    """Intel OpenMP (libiomp5.so, which the vLLM CPU wheel installs into its venv's lib/), as vLLM's CPU guide
    asks for in LD_PRELOAD: its worker warns that speculative decoding without it loses speed, and it measured
    so here (docs/BENCHMARKS.md, "vLLM's CPU settings"). A user's own LD_PRELOAD is kept as it is, an empty one
    included (that runs vLLM with its default, PyTorch's libgomp)."""
    iomp = engine.venv / "lib" / "libiomp5.so"
    return iomp if iomp.is_file() else None


def run_worker(engine: EngineEnv, job: dict[str, Any], log: Path) -> VllmRun:
    """Run one job in the engine's venv; a failure is one line with vLLM's last error and the log's path."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job_file, result_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        with log.open("w") as f:
            code = subprocess.run(
                [str(engine.python), str(WORKER), str(job_file), str(result_file)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=worker_env(engine),
            ).returncode
        if code != 0 or not result_file.is_file():
            raise UserError(f"vLLM failed (exit {code}): {last_error(log)} (full log: {log})")
        result = json.loads(result_file.read_text())
    return VllmRun(result["vllm_version"], result["load_s"], result["outputs"], result["counters"])


def last_error(log: Path) -> str:
    """The most telling line of a failed vLLM run: the last exception message, else the last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and "Engine core initialization failed" not in line:
            return line[:400]
    return lines[-1][:400] if lines else "no output"
