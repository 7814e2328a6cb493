r"""The scaled data path and one EAGLE-3 scaling point on a GPU, inside a fixed time (docs/BENCHMARKS.md, "On a
GPU"): the target's greedy answers to a prompt file, its features cached, EAGLE-3 trained on them, then sampled
answers to the same prompts with the time that is left. Every stage is a draftsmith command; each one that
would outrun its deadline is stopped with Ctrl-C (answers and checkpoints written so far are kept) and the next
one goes on. What was made is packed into --out in pieces of at most 15 MiB, with summary.json (the device,
every stage's wall time, exit status and counts).

    python -m bench.gpu_run --gguf FILE --prompts prompts.jsonl.gz --work /tmp/w --out OUT \
        [--budget-s 515] [--greedy-until 215] [--cache-until 300] [--train-until 440] [--batch-size 512]

--target DIR takes a target directory instead of a .gguf file (the smoke run on a toy target does). The
*-until options are seconds from the start, like --budget-s.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

RECIPE = "recipes/eagle/eagle3_smollm2_scale.yaml"
PIECE = 15 * 1024 * 1024  # what comes back from the device machine: files of at most 16 MiB


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0


def run_until(cmd: list[str], deadline: float, clock: Clock, log: Path) -> dict[str, Any]:
    """Run `cmd` (output appended to `log`); Ctrl-C at `deadline` seconds, a kill 30 s later."""
    began = clock.now()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        stopped = False
        try:
            proc.wait(timeout=max(1.0, deadline - began))
        except subprocess.TimeoutExpired:
            stopped = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    record = {
        "seconds": round(clock.now() - began, 1),
        "exit": proc.returncode,
        "stopped_at_deadline": stopped,
    }
    print(f"{cmd[3:5]}: {record}", flush=True)
    return record


def regenerate(
    args: argparse.Namespace, out: Path, sampling: list[str], deadline: float, clock: Clock
) -> dict:
    cmd = [sys.executable, "-m", "draftsmith.scripts.cli", "data", "regenerate", "--target", str(args.target)]
    cmd += ["--data", str(args.prompts), "--out", str(out), "--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--batch-size", str(args.batch_size), "--dtype", "bfloat16", "--no-progress", *sampling]
    cmd += ["--max-samples", str(args.max_samples)] if args.max_samples else []
    record = run_until(cmd, deadline, clock, args.work / "log.txt")
    meta = out.with_name(out.name + ".meta.json")
    if meta.is_file():
        runs = json.loads(meta.read_text()).get("runs", [])
        record["counts"] = runs[-1]["counts"] if runs else None
    return record


def eagle(args: argparse.Namespace, stage: str, deadline: float, clock: Clock, extra: list[str]) -> dict:
    common = [
        f"target.path={args.target}",
        "target.dtype=bfloat16",
        f"data.train=[{args.work / 'greedy.jsonl'}]",
    ]
    common += [f"data.cache={args.work / 'cache'}", f"data.max_len={args.max_len}", *args.set]
    cmd = [
        sys.executable,
        "-m",
        "draftsmith.scripts.cli",
        stage,
        "eagle",
        "--config",
        RECIPE,
        *common,
        *extra,
    ]
    return run_until(cmd, deadline, clock, args.work / "log.txt")


def pack(paths: list[Path], name: str, out: Path, root: Path) -> list[str]:
    """`paths` (relative to `root` in the archive) as NAME.tar.gz in pieces of at most PIECE bytes."""
    archive = root / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in paths:
            if p.exists():
                tar.add(p, arcname=str(p.relative_to(root)))
    data = archive.read_bytes()
    pieces = [data[i : i + PIECE] for i in range(0, len(data), PIECE)] or [b""]
    names = [f"{name}.tar.gz" if len(pieces) == 1 else f"{name}.tar.gz.{k}" for k in range(len(pieces))]
    for piece_name, piece in zip(names, pieces, strict=True):
        (out / piece_name).write_bytes(piece)
    return names


def drafter_files(run: Path) -> list[Path]:
    """The run's final drafter, or (stopped early) its newest checkpoint's weights; its config and metrics."""
    final = run / "final"
    if (final / "model.safetensors").is_file():
        weights = [final]
    else:
        checkpoints = sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        weights = [checkpoints[-1] / n for n in ("model.safetensors", "config.yaml")] if checkpoints else []
    return [*weights, run / "config.yaml", run / "metrics.jsonl"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="the target's .gguf file (built into WORK/target first)")
    source.add_argument("--target", type=Path, help="a target directory")
    p.add_argument("--prompts", type=Path, required=True, help="conversations whose answers are regenerated")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=515)
    p.add_argument("--greedy-until", type=float, default=215)
    p.add_argument("--cache-until", type=float, default=300)
    p.add_argument("--train-until", type=float, default=440)
    p.add_argument(
        "--batch-size",
        type=int,
        default=512,
        help="answers generated together (512: 4,480 tokens/s on an H100)",
    )
    p.add_argument("--cache-batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-len", type=int, default=768, help="data.max_len of the cache and training")
    p.add_argument("--max-samples", type=int, default=None, help="the first N prompts only")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for the cache and training (e.g. draft.draft_vocab_size=512); repeatable",
    )
    args = p.parse_args(argv)
    clock = Clock()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"stages": {}}
    try:
        import torch

        summary["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        summary["torch"] = torch.__version__
        if args.gguf:
            from draftsmith.models.gguf import dequantize

            target = args.work / "target"
            if not (target / "build.json").is_file():
                summary["stages"]["target"] = dequantize(args.gguf, target, {"gguf_file": args.gguf.name})
            args.target = target
        stages = summary["stages"]
        stages["greedy"] = regenerate(
            args, args.work / "greedy.jsonl", ["--temperature", "0"], args.greedy_until, clock
        )
        stages["cache"] = eagle(
            args, "cache", args.cache_until, clock, ["--batch-size", str(args.cache_batch_size)]
        )
        if stages["cache"]["exit"] == 0:
            train = [f"output_dir={args.work / 'run'}", "train.epochs=1", "train.mixed_precision=bf16"]
            train += ["data.cache_verify=false", "checkpoint.every=100"]
            stages["train"] = eagle(args, "train", args.train_until, clock, train)
        sampled = ["--temperature", "0.8", "--top-p", "0.95", "--seed", "1"]
        stages["sampled"] = regenerate(args, args.work / "sampled-1.jsonl", sampled, args.budget_s, clock)
    finally:
        work = args.work
        answers = [work / f"{n}{s}" for n in ("greedy.jsonl", "sampled-1.jsonl") for s in ("", ".meta.json")]
        summary["packed"] = pack(answers, "answers", args.out, work)
        summary["packed"] += pack(drafter_files(work / "run"), "drafter", args.out, work)
        summary["seconds"] = round(clock.now(), 1)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        log = (work / "log.txt").read_bytes() if (work / "log.txt").is_file() else b""
        (args.out / "log.txt").write_bytes(log[-PIECE:])
        print(json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
