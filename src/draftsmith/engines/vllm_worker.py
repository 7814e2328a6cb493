"""Decode prompts in vLLM, `batch_size` requests at a time (default 1), and report what vLLM measured (run
inside the engine's venv).

    <engine venv>/bin/python vllm_worker.py JOB.json RESULT.json

`draftsmith engine-eval` writes the job and reads the result; this file imports nothing of draftsmith (the
engine's venv does not have it) and only the standard library besides vLLM. The job gives the target
directory, the speculative config (null: plain decoding), the prompts as token ids (rendered by draftsmith, so
both sides decode the same tokens), the sampling settings, the stop token ids and one seed per prompt. vLLM's
tokenizer is not loaded (`skip_tokenizer_init`): the prompts are ids, the answers stay ids, and the stop ids
are exactly draftsmith's.

The result holds each answer's token ids, finish reason and wall time (a batch's, divided among its
requests), and the difference of vLLM's own
speculative-decoding counters (`vllm:spec_decode_*`, read through `LLM.get_metrics()`) over the measured
requests: the warm-up request before them is not counted.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

# this file's folder is sys.path[0] when it runs as a script: keep it from shadowing installed packages
# (draftsmith's engines/ has modules of its own there)
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(llm: Any) -> dict[str, Any]:
    """vLLM's cumulative speculative-decoding counters, summed over engines."""
    out: dict[str, Any] = {name: 0 for name in COUNTERS.values()}
    out["accepted_per_position"] = []
    for metric in llm.get_metrics():
        name = metric.name.removesuffix("_total")
        if name in COUNTERS:
            out[COUNTERS[name]] += int(metric.value)
        elif name == PER_POSITION:
            values = [int(v) for v in metric.values]
            prev = out["accepted_per_position"] + [0] * max(
                0, len(values) - len(out["accepted_per_position"])
            )
            out["accepted_per_position"] = [
                p + (values[i] if i < len(values) else 0) for i, p in enumerate(prev)
            ]
    return out


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out = {k: after[k] - before[k] for k in COUNTERS.values()}
    prev = before["accepted_per_position"]
    out["accepted_per_position"] = [
        a - (prev[i] if i < len(prev) else 0) for i, a in enumerate(after["accepted_per_position"])
    ]
    return out


def run(job: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {
        "model": job["model"],
        "dtype": job["dtype"],
        "max_model_len": job["max_model_len"],
        "seed": job["seed"],
        "disable_log_stats": False,  # get_metrics() needs the stat loggers
        "skip_tokenizer_init": True,
        "enforce_eager": job["enforce_eager"],
        "trust_remote_code": job.get("trust_remote_code", False),
        # off unless the job says otherwise: a prompt cached up to its last token would be padded to a step of
        # placeholder drafts that vLLM counts as a draft with none accepted (engine_eval.job)
        "enable_prefix_caching": job.get("enable_prefix_caching", False),
    }
    if job["speculative_config"] is not None:
        kwargs["speculative_config"] = job["speculative_config"]
    start = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - start

    def params(max_tokens: int, seed: int) -> Any:
        return SamplingParams(
            temperature=job["temperature"],
            top_p=job["top_p"],
            top_k=job["top_k"] if job["top_k"] > 0 else -1,
            max_tokens=max_tokens,
            seed=seed if job["temperature"] > 0 else None,
            stop_token_ids=job["stop_token_ids"],
            detokenize=False,
        )

    prompts = job["prompts"]
    # warm-up (not measured): the first request pays for lazy initialisation and, compiled, its graph capture
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params(8, 0), use_tqdm=False)
    before = read_counters(llm)
    outputs = []
    size = job.get("batch_size", 1)
    for start in range(0, len(prompts), size):
        group = range(start, min(start + size, len(prompts)))
        t0 = time.perf_counter()
        results = llm.generate(
            [TokensPrompt(prompt_token_ids=prompts[i]) for i in group],
            [params(job["max_tokens"], job["seeds"][i]) for i in group],
            use_tqdm=False,
        )
        wall = (time.perf_counter() - t0) / len(group)  # a batch's wall time, shared by its requests
        for result in results:
            done = result.outputs[0]
            outputs.append(
                {"token_ids": list(done.token_ids), "finish_reason": done.finish_reason, "wall_s": wall}
            )
    counters = difference(read_counters(llm), before)
    return {"vllm_version": vllm.__version__, "load_s": load_s, "outputs": outputs, "counters": counters}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vllm_worker.py JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    result = run(job)
    tmp = Path(argv[1] + ".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    tmp.replace(argv[1])
    return 0


if __name__ == "__main__":  # vLLM starts its engine core with multiprocessing spawn: the guard is required
    sys.exit(main(sys.argv[1:]))
