"""Training under accelerate's engines, launched exactly as users do (`accelerate launch --config_file
recipes/accelerate/<engine>.yaml train/<method>.py ...`), on CPU with 2 processes over gloo.

FSDP and DeepSpeed run only on GPUs (accelerate's own rule); on CPU their launches must be refused, and
the target sharding they use is checked here directly with 2 gloo processes. The full FSDP / ZeRO runs are
the GPU test at the end (one process per GPU), skipped on machines without a GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from _run import REPO, assert_runs_match, env, run_recipe
from safetensors.torch import load_file

from draftsmith.train.core.metrics import read_metrics

SHORT = ["train.max_steps=6", "checkpoint.every=0", "train.micro_batch_size=2", "eval.every=0", "log.every=1"]


@pytest.mark.parametrize(
    ("method", "recipe", "extra"),
    [
        ("mtp", "mtp/toy.yaml", ["data.max_samples=64", "data.max_len=128", "data.eval_max_samples=8"]),
        (
            "distill",
            "distill/toy.yaml",
            ["data.max_samples=64", "data.max_len=128", "data.eval_max_samples=8"],
        ),
    ],
)
def test_ddp_config_two_processes_match_one_with_accumulation(
    tiny_toy_target, tmp_path, method, recipe, extra
):
    """Every training script runs unchanged under recipes/accelerate/ddp.yaml (Medusa and EAGLE have the
    same test in their own files); 2 ranks x micro-batch 2 == 1 rank x micro-batch 2 x accumulation 2."""
    common = [*SHORT, *extra, "target.dtype=float32"]
    run_recipe(
        tiny_toy_target,
        tmp_path / "ddp",
        *common,
        "train.grad_accum=1",
        nproc=2,
        method=method,
        recipe=recipe,
    )
    run_recipe(
        tiny_toy_target,
        tmp_path / "one",
        *common,
        "train.grad_accum=2",
        method=method,
        recipe=recipe,
        engine="single",
    )
    assert_runs_match(tmp_path / "ddp", tmp_path / "one", 6)


def test_resume_across_a_change_of_world_size(tiny_toy_target, tmp_path):
    """A run checkpointed with 1 process x accumulation 2 resumes with 2 processes x accumulation 1 (the same
    global batch) and ends bit-identical to the uninterrupted single-process run."""
    common = ["train.max_steps=8", "checkpoint.every=4", "checkpoint.keep_last=0", "log.every=1"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_recipe(tiny_toy_target, straight, *common, "train.grad_accum=2", engine="single")
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoint-8")  # as if the run had died after its step-4 checkpoint
    shutil.rmtree(resumed / "final")
    run_recipe(tiny_toy_target, resumed, *common, "train.grad_accum=1", "--resume", nproc=2)
    state = json.loads((resumed / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["num_processes"] == 2 and state["step"] == 8
    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    la = [r["train/loss"] for r in read_metrics(straight / "metrics.jsonl") if "train/loss" in r]
    lb = [r["train/loss"] for r in read_metrics(resumed / "metrics.jsonl") if "train/loss" in r]
    assert lb == pytest.approx(la, abs=1e-6) and len(lb) == 8
    # Only the drafter is in the optimizer: its parameter count is exactly what final/ holds.
    assert state["trainable_parameters"] == sum(t.numel() for t in b.values())


@pytest.mark.parametrize("engine", ["fsdp", "zero2", "zero3"])
def test_sharding_engines_are_refused_on_cpu_with_a_clear_message(tiny_toy_target, tmp_path, engine):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the engines run (see the GPU test)")
    proc = run_recipe(
        tiny_toy_target, tmp_path / "r", "train.max_steps=2", nproc=2, engine=engine, check=False
    )
    assert proc.returncode != 0
    assert "this machine has no GPU" in proc.stderr and "recipes/accelerate/ddp.yaml" in proc.stderr
    # Each process prints one `error:` line (the launcher then reports the failed children on its own).
    assert (
        "error: this run was launched with a" in proc.stderr and "EngineUnavailableError" not in proc.stderr
    )
    assert not (tmp_path / "r" / "final").exists()


@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
def test_frozen_target_sharded_across_two_processes_computes_the_same(tiny_toy_target, tmp_path, kind):
    """The target sharding FSDP / ZeRO-3 training uses, on 2 gloo processes: every rank holds a part of the
    weights, and features, logits, the embedding / head calls drafters make and the gradient back through the
    frozen head (into a drafter's features) equal the unsharded target's."""
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "tests" / "recipes" / "_shard_target.py"),
        kind,
        str(tiny_toy_target),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["local"] < 0.6 * result["full"]  # FSDP keeps the embedding and head whole on every rank
    if kind == "zero3":
        assert result["local"] == pytest.approx(result["full"] / 2, rel=0.01)
    assert max(result["diffs"].values()) <= 1e-6, result["diffs"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP and DeepSpeed run only on GPUs (none here)")
@pytest.mark.parametrize("engine", ["ddp", "fsdp", "zero2", "zero3"])
@pytest.mark.parametrize(
    ("method", "recipe"), [("medusa", "medusa/tiny.yaml"), ("eagle", "eagle/eagle3_tiny.yaml")]
)
def test_engines_on_gpu_train_save_and_resume(tiny_toy_target, tmp_path, engine, method, recipe):
    """On GPUs: each engine trains, its final/ loads, and a resumed run matches the uninterrupted one."""
    n = torch.cuda.device_count()
    common = [
        "train.max_steps=6",
        "checkpoint.every=3",
        "checkpoint.keep_last=0",
        "log.every=1",
        "target.dtype=float32",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_recipe(tiny_toy_target, straight, *common, nproc=n, engine=engine, method=method, recipe=recipe)
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoint-6")
    shutil.rmtree(resumed / "final")
    run_recipe(
        tiny_toy_target, resumed, *common, "--resume", nproc=n, engine=engine, method=method, recipe=recipe
    )
    la = [r["train/loss"] for r in read_metrics(straight / "metrics.jsonl") if "train/loss" in r]
    lb = [r["train/loss"] for r in read_metrics(resumed / "metrics.jsonl") if "train/loss" in r]
    assert lb == pytest.approx(la, rel=1e-3) and la[-1] < la[0]
    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(t.numel() > 0 for t in a.values())
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=1e-3, rtol=1e-3)
