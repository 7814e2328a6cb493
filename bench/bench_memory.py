"""Peak memory of one training step, and how much of it grows with each training token.

    python bench/bench_memory.py --out /tmp/bench-memory.jsonl
    python bench/bench_memory.py --methods eagle3 --vocab 128256 --seq 1024,2048 --out /tmp/e3.jsonl
    python bench/bench_memory.py --report /tmp/bench-memory.jsonl     # tables from earlier rows

For each method (EAGLE-3 with a 32,000-token draft vocabulary and 7 TTT steps, Medusa with 3 heads, MTP
with 2 modules, distillation into a 1-layer copy of the target) and each vocabulary size V and sequence
length T, one training step (the method's own `loss_terms`, then backward; no optimizer step) runs on a
random Llama target with hidden size 256 and 2 layers built in-process, micro-batch 1, every token an
answer token, float32, 2 threads.

Memory: every configuration runs in a fresh subprocess. After the target and drafter are built and one
warm-up step at T=64 has run, the kernel's high-water mark of the resident set is reset (writing 5 to
/proc/self/clear_refs) and VmRSS read; the step's peak is VmHWM afterwards minus that VmRSS: every byte the
step touched at its peak (tensors, allocator slack, thread buffers), nothing built before it. Where
clear_refs cannot be written, the peak is getrusage's ru_maxrss (which then includes building) minus the
RSS after building, and the row says so.

Allocator: the workers run with MALLOC_MMAP_THRESHOLD_=1048576 (--mmap-threshold) unless told 0. glibc's
default threshold rises to 32 MiB after the first large free, so tensors below it come from heap arenas that
glibc keeps (and fragments) after they are freed: the RSS then grows with the number of chunk-sized buffers a
step ever allocated, not with what it holds. With the fixed threshold every tensor from 1 MiB up is its own
mapping, returned to the system when freed, and the peak RSS follows the live tensors. The setting slows
steps (every large allocation is a fresh mapping); time steps with --mmap-threshold 0.

The increment per training token is the slope between two sequence lengths: (peak(T2) - peak(T1)) /
(T2 - T1) bytes, also given in float32 vocabulary rows (4 V bytes). A configuration whose estimated peak
exceeds --max-gb is skipped and reported as "skipped (est. N GB)". The estimate extrapolates the last
measured lengths of the same method and V (linearly, or through the origin if that is larger); before any
measurement it assumes 10 float32 vocabulary rows per token on top of the parameters.

Feeds docs/BENCHMARKS.md, "Memory per training token".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from draftsmith.runtime.display import table as md_table

HIDDEN, LAYERS, INTERMEDIATE, HEADS = 256, 2, 1024, 4
DRAFT_VOCAB, TTT_STEPS, MEDUSA_HEADS, MTP_MODULES, DISTILL_LAYERS = 32_000, 7, 3, 2, 1
WARMUP_T = 64
MMAP_THRESHOLD = 1 << 20  # bytes: every allocation from 1 MiB up is its own mapping, unmapped when freed
PRIOR_ROWS_PER_TOKEN = 10.0  # only for the skip estimate before anything is measured
METHODS = ("eagle3", "medusa", "mtp", "distill")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def build_target(vocab: int, max_len: int) -> Any:
    """A random Llama target (hidden 256, 2 layers) as a `FrozenTarget`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.models.target import FrozenTarget

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    # The target's tokenizer only supplies pad / eos ids here (distillation's stop ids); no text is tokenized.
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1, chat_template=None)
    return FrozenTarget(model, tokenizer, "bench-random-llama")


def build_method(name: str, target: Any, seq: int) -> Any:
    """The method as its training script builds it (the recipe's own `build_method`)."""
    import torch

    from draftsmith.models.draft_lm import DraftLMConfig
    from draftsmith.models.eagle import EagleConfig
    from draftsmith.models.medusa import MedusaConfig
    from draftsmith.models.mtp import MTPConfig
    from draftsmith.train import distill, eagle, medusa, mtp

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, target.vocab_size, (seq,), generator=g)
    # EAGLE-3 picks its draft vocabulary from the training data's answer tokens; the others ignore the data.
    data: Any = SimpleNamespace(train=[{"input_ids": ids, "loss_mask": torch.ones(seq, dtype=torch.bool)}])
    recipes: dict[str, tuple[Any, Any]] = {
        "medusa": (medusa, medusa.MedusaRecipe(draft=MedusaConfig(num_heads=MEDUSA_HEADS))),
        "eagle3": (
            eagle,
            eagle.EagleRecipe(
                draft=EagleConfig(
                    version=3, feature_layers=[0, 1, 2], draft_vocab_size=DRAFT_VOCAB, ttt_steps=TTT_STEPS
                )
            ),
        ),
        "mtp": (mtp, mtp.MTPRecipe(draft=MTPConfig(num_modules=MTP_MODULES))),
        "distill": (
            distill,
            distill.DistillRecipe(draft=DraftLMConfig(init="target", num_layers=DISTILL_LAYERS)),
        ),
    }
    if name not in recipes:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    module, recipe = recipes[name]
    return module.build_method(recipe, target, data)


def make_batch(vocab: int, seq: int, seed: int) -> dict[str, Any]:
    """Micro-batch 1 of `seq` random tokens, all of them answer tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "loss_mask": torch.ones_like(ids, dtype=torch.bool),
    }


def train_step(method: Any, batch: dict[str, Any]) -> None:
    """Forward and backward as the training loop runs them (term sums over token counts, weighted)."""
    counts = method.token_counts(batch).clamp(min=1)
    sums, _ = method.loss_terms(method.model, batch)
    loss = (method.term_weights * sums.float() / counts).sum()
    loss.backward()


def worker(name: str, vocab: int, seq: int, loss_chunk: int) -> dict[str, Any]:
    """One configuration, measured in this (fresh) process."""
    import torch

    torch.set_num_threads(2)
    target = build_target(vocab, seq + 64)
    method = build_method(name, target, seq)
    if loss_chunk and hasattr(method, "loss_chunk"):
        method.loss_chunk = loss_chunk
    method.model.train()
    built_kb = _status_kb("VmRSS")
    train_step(method, make_batch(vocab, WARMUP_T, seed=2))
    method.model.zero_grad(set_to_none=True)
    batch = make_batch(vocab, seq, seed=3)
    gc.collect()
    reset = _reset_high_water_mark()
    base_kb = _status_kb("VmRSS") if reset else built_kb
    start = time.perf_counter()
    train_step(method, batch)
    step_s = time.perf_counter() - start
    peak_kb = _status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "method": name,
        "vocab": vocab,
        "seq": seq,
        "loss_chunk": getattr(method, "loss_chunk", None),
        "step_s": step_s,
        "base_bytes": base_kb * 1024,
        "peak_bytes": peak_kb * 1024,
        "step_peak_bytes": (peak_kb - base_kb) * 1024,
        "measure": "VmHWM after clear_refs reset - VmRSS" if reset else "ru_maxrss - VmRSS after build",
        "malloc": f"MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}"
        if "MALLOC_MMAP_THRESHOLD_" in os.environ
        else "glibc default",
    }


def parameter_bytes(name: str, vocab: int) -> int:
    """float32 bytes of the target and drafter parameters (for the skip estimate only)."""
    layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE
    target = 2 * vocab * HIDDEN + LAYERS * layer
    drafter = {
        "medusa": MEDUSA_HEADS * vocab * HIDDEN,
        "eagle3": DRAFT_VOCAB * HIDDEN + 2 * layer,
        "mtp": MTP_MODULES * layer,
        "distill": 2 * vocab * HIDDEN + layer,
    }[name]
    return 4 * (target + 2 * drafter)  # the drafter's gradients too


def estimate(name: str, vocab: int, seq: int, measured: dict[int, int]) -> float:
    """Estimated peak bytes of a configuration, from the measured step peaks of shorter sequences."""
    params = parameter_bytes(name, vocab)
    if not measured:
        return params + PRIOR_ROWS_PER_TOKEN * 4 * vocab * seq
    lengths = sorted(measured)
    last = lengths[-1]
    through_origin = measured[last] * seq / last
    if len(lengths) == 1:
        return params + through_origin
    prev = lengths[-2]
    slope = (measured[last] - measured[prev]) / (last - prev)
    return params + max(through_origin, measured[last] + slope * (seq - last))


def run_config(name: str, vocab: int, seq: int, loss_chunk: int, mmap_threshold: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, str(vocab), str(seq), "--loss-chunk", str(loss_chunk)]
    env = dict(os.environ)
    if mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        return {"method": name, "vocab": vocab, "seq": seq, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slopes(rows: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(T1, T2, bytes per token) between consecutive measured lengths of one method and V."""
    done = sorted((r["seq"], r["step_peak_bytes"]) for r in rows if "step_peak_bytes" in r)
    return [(t1, t2, (p2 - p1) / (t2 - t1)) for (t1, p1), (t2, p2) in zip(done, done[1:], strict=False)]


def report(rows: list[dict[str, Any]]) -> str:
    """Markdown: peak and step time per configuration, then the increment per token per pair of lengths."""
    order = {name: i for i, name in enumerate(METHODS)}
    rows = sorted(rows, key=lambda r: (order.get(r["method"], len(order)), r["vocab"], r["seq"]))
    peaks = []
    for r in rows:
        if "step_peak_bytes" in r:
            cells = [f"{r['step_peak_bytes'] / 2**30:.2f} GiB", f"{r['step_s']:.2f} s"]
        elif "skipped_est_bytes" in r:
            cells = [f"skipped (est. {r['skipped_est_bytes'] / 1e9:.1f} GB)", "-"]
        else:
            cells = [f"failed: {r.get('error')}", "-"]
        peaks.append([r["method"], f"{r['vocab']:,}", r["seq"], *cells])
    out = md_table(["method", "V", "T", "step peak", "step time"], peaks)
    increments = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["vocab"]), []).append(r)
    for (name, vocab), group in groups.items():
        for t1, t2, per_token in slopes(group):
            increments.append(
                [
                    name,
                    f"{vocab:,}",
                    f"{t1} -> {t2}",
                    f"{per_token / 1e6:.3f} MB",
                    f"{per_token / (4 * vocab):.2f}",
                ]
            )
    out += [
        "",
        *md_table(
            ["method", "V", "T1 -> T2", "increment per token", "fp32 vocabulary rows per token"], increments
        ),
    ]
    measures = sorted(
        {f"{r['measure']} ({r.get('malloc', 'glibc default')})" for r in rows if "measure" in r}
    )
    out.append(f"\nPeak memory measured as: {'; '.join(measures) or 'n/a'} (one fresh process per row).")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}"
    )
    p.add_argument("--vocab", default="128256,262144", help="comma-separated vocabulary sizes")
    p.add_argument("--seq", default="512,1024,2048,4096", help="comma-separated sequence lengths")
    p.add_argument("--max-gb", type=float, default=8.0, help="skip configurations estimated above this (GB)")
    p.add_argument("--out", type=Path, help="append every row (JSON lines) to this file")
    p.add_argument("--report", type=Path, help="only print the tables of the rows in this file")
    p.add_argument(
        "--mmap-threshold",
        type=int,
        default=MMAP_THRESHOLD,
        help=f"MALLOC_MMAP_THRESHOLD_ of the workers (default {MMAP_THRESHOLD}); 0: glibc's dynamic default",
    )
    p.add_argument(
        "--loss-chunk",
        type=int,
        default=0,
        help="tokens per loss chunk (the methods' `loss_chunk`); 0: their default (code without chunking ignores it)",
    )
    p.add_argument("--worker", nargs=3, metavar=("METHOD", "V", "T"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(
            json.dumps(worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.loss_chunk)),
            flush=True,
        )
        return 0
    if args.report:
        print(report([json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]))
        return 0
    rows = []
    for name in args.methods.split(","):
        for vocab in (int(v) for v in args.vocab.split(",")):
            measured: dict[int, int] = {}
            for seq in sorted(int(t) for t in args.seq.split(",")):
                est = estimate(name, vocab, seq, measured)
                if est > args.max_gb * 1e9:
                    row: dict[str, Any] = {
                        "method": name,
                        "vocab": vocab,
                        "seq": seq,
                        "skipped_est_bytes": est,
                    }
                else:
                    row = run_config(name, vocab, seq, args.loss_chunk, args.mmap_threshold)
                    if "step_peak_bytes" in row:
                        measured[seq] = row["step_peak_bytes"]
                print(json.dumps(row), flush=True)
                rows.append(row)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
