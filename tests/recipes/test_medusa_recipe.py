"""End-to-end Medusa-1 runs on the `tiny` toy target (CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from _run import REPO, assert_runs_match, env, run_recipe, train_cmd
from safetensors.torch import load_file

from draftsmith.train.core.metrics import read_metrics


def initial_accuracy(target_dir):
    """Held-out top-1 of freshly initialised heads (lm_head copies), computed in-process as the baseline."""
    from accelerate import Accelerator

    from draftsmith.config.loader import load_config
    from draftsmith.models.medusa import MedusaHeads
    from draftsmith.models.target import FrozenTarget
    from draftsmith.train.core.data import build_datasets
    from draftsmith.train.core.loop import evaluate
    from draftsmith.train.medusa import MedusaMethod, MedusaRecipe

    cfg = load_config(MedusaRecipe, REPO / "recipes" / "medusa" / "tiny.yaml", [f"target.path={target_dir}"])
    torch.manual_seed(cfg.seed)
    target = FrozenTarget.load(cfg.target)
    data = build_datasets(cfg.data, target.tokenizer, seed=cfg.seed, progress=False)
    heads = MedusaHeads(cfg.draft, target.hidden_size, target.vocab_size)
    heads.init_from_lm_head(target.lm_head.weight)
    method = MedusaMethod(target, heads)
    return evaluate(method, heads, data.eval, target.tokenizer.pad_token_id, Accelerator(cpu=True), 16)


def test_medusa_heads_learn(tiny_toy_target, tmp_path):
    before = initial_accuracy(tiny_toy_target)
    proc = run_recipe(tiny_toy_target, tmp_path / "run")
    final = tmp_path / "run" / "final"
    config = json.loads((final / "config.json").read_text())
    after = config["training"]["heldout"]
    # The run's own step-0 evaluation agrees with the in-process oracle (same seed, same initialisation).
    assert config["training"]["heldout_at_start"]["eval/depth1/top1"] == pytest.approx(
        before["eval/depth1/top1"], abs=0.01
    )
    assert config["kind"] == "medusa" and config["target"]["num_layers"] >= 2
    # Head 1 (predicting t+2) starts as the target's own next-token head applied one token early (~2%
    # top-1 on the tiny target); after 150 steps it reaches ~10%, bounded by how predictable the weak
    # tiny target's text is.
    assert after["eval/depth1/top1"] > 3 * before["eval/depth1/top1"], (before, after)
    assert after["eval/depth1/top1"] > before["eval/depth1/top1"] + 0.05, (before, after)
    assert after["eval/depth1/loss"] < before["eval/depth1/loss"] - 1.0, (before, after)
    assert after["eval/depth1/top1"] > after["eval/depth2/top1"]  # nearer tokens are easier
    assert "| 1 | t+2 | " in proc.stdout and " -> " in proc.stdout
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, 151))


def test_two_processes_match_one_process_with_accumulation(tiny_toy_target, tmp_path):
    common = ["train.max_steps=12", "checkpoint.every=0", "train.micro_batch_size=2"]
    run_recipe(tiny_toy_target, tmp_path / "ddp", *common, "train.grad_accum=1", nproc=2)
    run_recipe(tiny_toy_target, tmp_path / "acc", *common, "train.grad_accum=2", nproc=1)
    assert_runs_match(tmp_path / "ddp", tmp_path / "acc", 12)


def test_sigkill_and_resume_equals_uninterrupted(tiny_toy_target, tmp_path):
    overrides = ["train.max_steps=40", "checkpoint.every=10", "checkpoint.keep_last=2"]
    run_recipe(tiny_toy_target, tmp_path / "straight", *overrides)

    out = tmp_path / "killed"
    args = [
        *train_cmd(),
        "--config",
        str(REPO / "recipes" / "medusa" / "tiny.yaml"),
        f"target.path={tiny_toy_target}",
        f"output_dir={out}",
        *overrides,
    ]
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    # Kill it between checkpoints: after step 25 is logged (checkpoints at 10 and 20 exist, 30 does not).
    while time.time() < deadline:
        if metrics.is_file() and sum(1 for _ in metrics.open()) >= 25:
            break
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "final").exists()
    assert (out / "checkpoint-20").is_dir()

    run_recipe(tiny_toy_target, out, *overrides, "--resume")
    a = load_file(str(tmp_path / "straight" / "final" / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [r["step"] for r in read_metrics(metrics) if "train/loss" in r]
    assert steps == list(range(1, 41))  # the log reads as one uninterrupted run
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-30", "checkpoint-40"]


def test_refuses_to_overwrite_a_run_and_explains(tiny_toy_target, tmp_path):
    run_recipe(tiny_toy_target, tmp_path / "r", "train.max_steps=2", "checkpoint.every=1")
    proc = subprocess.run(
        [
            *train_cmd(),
            "--config",
            str(REPO / "recipes" / "medusa" / "tiny.yaml"),
            f"target.path={tiny_toy_target}",
            f"output_dir={tmp_path / 'r'}",
            "train.max_steps=2",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "pass --resume" in proc.stderr and "Traceback" not in proc.stderr


def test_wandb_offline_needs_no_account(tiny_toy_target, tmp_path):
    run_recipe(
        tiny_toy_target,
        tmp_path / "w",
        "train.max_steps=2",
        "checkpoint.every=0",
        "log.wandb=true",
        "data.max_samples=40",
        "data.eval_max_samples=8",
    )
    runs = list((tmp_path / "w" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")), "wandb wrote no run file"
