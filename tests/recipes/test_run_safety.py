"""A run directory has one writer, checkpoints hold no pickle, and resuming trusts nothing it has not checked
(Medusa-1 on the `tiny` toy target, CPU, through the command a user runs)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys

import pytest
from _run import SHORT, run_recipe, same_weights

from draftsmith.runtime.run_lock import LOCK_NAME
from draftsmith.train.core.metrics import read_metrics


def _interrupted(straight, tmp_path, keep=("checkpoint-2", "checkpoint-4")):
    """A copy of the straight run as a run killed after its step-4 checkpoint (no final/, no lock)."""
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    shutil.rmtree(out / "final")
    for ckpt in out.glob("checkpoint-*"):
        if ckpt.name not in keep:
            shutil.rmtree(ckpt)
    return out


def test_checkpoints_hold_only_safetensors_json_and_yaml_with_a_manifest(straight):
    for ckpt in straight.glob("checkpoint-*"):
        names = sorted(p.name for p in ckpt.iterdir())
        assert all(n.endswith((".safetensors", ".json", ".yaml")) for n in names), names
        manifest = json.loads((ckpt / "manifest.json").read_text())
        assert manifest["format"] == "draftsmith-state-1"
        assert set(manifest["files"]) == set(names) - {"manifest.json"}
    assert not (straight / LOCK_NAME).exists()  # released at the end


def test_resume_from_the_safe_format_is_bit_identical(straight, tiny_toy_target, tmp_path):
    out = _interrupted(straight, tmp_path)
    run_recipe(tiny_toy_target, out, *SHORT, "--resume")
    assert same_weights(out, straight)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r] == list(range(1, 7))


def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(straight, tiny_toy_target, tmp_path):
    out = _interrupted(straight, tmp_path)
    weights = out / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one flipped bit in a tensor value
    weights.write_bytes(bytes(data))
    proc = run_recipe(tiny_toy_target, out, *SHORT, "--resume")
    assert "skipping damaged checkpoint-4" in proc.stdout and "sha256" in proc.stdout
    assert same_weights(out, straight)  # resumed from step 2, still the same run


def test_a_named_damaged_checkpoint_is_refused_in_one_line(straight, tiny_toy_target, tmp_path):
    out = _interrupted(straight, tmp_path)
    (out / "checkpoint-4" / "optimizer.safetensors").write_bytes(b"")  # truncated
    proc = run_recipe(tiny_toy_target, out, *SHORT, f"--resume={out / 'checkpoint-4'}", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "optimizer.safetensors is 0 bytes" in proc.stderr


class _Payload:
    """Unpickling this writes a file: proof that a pickle ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("with_manifest", [True, False])
def test_a_planted_pickle_is_never_loaded(straight, tiny_toy_target, tmp_path, with_manifest):
    """A checkpoint from elsewhere holding a pickle (accelerate's `scheduler.bin` name, or no manifest at all as
    draftsmith wrote before) is refused unless --trust-pickle, and the payload never runs."""
    out = _interrupted(straight, tmp_path)
    marker = tmp_path / "pwned"
    ckpt = out / "checkpoint-4"
    (ckpt / "scheduler.bin").write_bytes(pickle.dumps(_Payload(marker)))
    if not with_manifest:
        (ckpt / "manifest.json").unlink()
    else:  # a manifest listing the pickle, so that only the pickle rule can refuse it
        from draftsmith.train.core.train_state import write_manifest

        write_manifest(ckpt, "accelerate-pickle")
    proc = run_recipe(tiny_toy_target, out, *SHORT, f"--resume={ckpt}", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "scheduler.bin" in proc.stderr and "--trust-pickle" in proc.stderr
    assert not marker.exists()
    latest = run_recipe(tiny_toy_target, out, *SHORT, "--resume", check=False)  # "latest" refuses it too
    assert latest.returncode == 1 and not marker.exists()


def test_a_second_writer_is_refused_and_a_stale_lock_taken_over(straight, tiny_toy_target, tmp_path):
    out = _interrupted(straight, tmp_path)
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": "now",
        "command": "pytest",
        "purpose": "training",
    }
    (out / LOCK_NAME).write_text(json.dumps(holder))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = run_recipe(tiny_toy_target, out, *SHORT, "--resume", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"in use by training, pid {os.getpid()}" in proc.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing touched
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (out / LOCK_NAME).write_text(json.dumps({**holder, "pid": int(dead.stdout)}))
    proc = run_recipe(tiny_toy_target, out, *SHORT, "--resume")
    assert "took over the stale lock" in proc.stdout
    assert same_weights(out, straight) and not (out / LOCK_NAME).exists()


def test_a_partial_last_metrics_line_does_not_block_resume(straight, tiny_toy_target, tmp_path):
    out = _interrupted(straight, tmp_path)
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "train/lo')  # killed while appending
    run_recipe(tiny_toy_target, out, *SHORT, "--resume")
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r] == list(range(1, 7))
