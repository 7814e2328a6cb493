"""Faults in the middle of a training run, planted at exact points (tests/recipes/_fault.py): SIGKILL while a
checkpoint or final/ is half written, a second writer while a run is going and two runs started at once, a real
full or read-only filesystem (a tmpfs mounted for the test), and Ctrl-C or SIGTERM in the middle of a step.
Every fault ends in one line or a kill, loses nothing of the earlier good state, and the resumed run equals the
uninterrupted one bit for bit.

Medusa-1 on the `tiny` toy target, CPU, through the command a user runs (`SHORT`: 6 steps, a checkpoint
every 2)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _run import REPO, SHORT, env, run_recipe, same_weights

from draftsmith.runtime.run_lock import LOCK_NAME
from draftsmith.train.core.metrics import read_metrics

FAULT = str(REPO / "tests" / "recipes" / "_fault.py")


def _args(target: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "recipes" / "medusa" / "tiny.yaml"),
        f"target.path={target}",
        f"output_dir={out}",
        *SHORT,
        *extra,
    ]


def _faulty(fault: str, target: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, FAULT, fault, str(REPO / "train" / "medusa.py"), *_args(target, out, *extra)]
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600, cwd=REPO)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl") if "train/loss" in r]


def _resumed_equals_straight(target: Path, out: Path, straight: Path) -> subprocess.CompletedProcess:
    proc = run_recipe(target, out, *SHORT, "--resume")
    assert same_weights(out, straight)
    assert _train_steps(out) == list(range(1, 7))
    assert _train_steps(out) == _train_steps(straight)
    evals = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "eval/loss" in r]
    assert evals == [r["step"] for r in read_metrics(straight / "metrics.jsonl") if "eval/loss" in r]
    assert not list(out.glob("*.tmp")) and not (out / LOCK_NAME).exists()
    return proc


# ---- kills while writing ------------------------------------------------------------------------------------


def test_a_kill_while_a_checkpoint_is_written_resumes_bit_identical(straight, tiny_toy_target, tmp_path):
    out = tmp_path / "run"
    proc = _faulty("kill-checkpoint:4", tiny_toy_target, out)
    assert proc.returncode == -9  # SIGKILL: no handler ran
    assert (out / "checkpoint-4.tmp" / "model.safetensors").is_file()  # half written: state, no manifest
    assert not (out / "checkpoint-4.tmp" / "manifest.json").exists()
    assert (
        not (out / "checkpoint-4").exists()
        and (out / "checkpoint-2").is_dir()
        and not (out / "final").exists()
    )
    resumed = _resumed_equals_straight(tiny_toy_target, out, straight)
    assert "took over the stale lock" in resumed.stdout  # the killed run's lock names a dead pid


def test_a_kill_while_final_is_written_resumes_to_the_same_final(straight, tiny_toy_target, tmp_path):
    out = tmp_path / "run"
    proc = _faulty("kill-final", tiny_toy_target, out)
    assert proc.returncode == -9
    assert (out / "final.tmp" / "model.safetensors").is_file() and not (out / "final").exists()
    assert (out / "checkpoint-6").is_dir()
    _resumed_equals_straight(tiny_toy_target, out, straight)  # writes final/ from checkpoint-6, no step rerun


# ---- concurrent writers -------------------------------------------------------------------------------------


def test_a_second_training_and_a_resume_are_refused_while_a_run_is_going(straight, tiny_toy_target, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        FAULT,
        "pause-checkpoint:2",
        str(REPO / "train" / "medusa.py"),
        *_args(tiny_toy_target, out),
    ]
    running = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "paused").exists():
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(0.1)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        second = run_recipe(tiny_toy_target, out, *SHORT, check=False)
        resume = run_recipe(tiny_toy_target, out, *SHORT, "--resume", check=False)
        for proc in (second, resume):
            line = _one_error_line(proc)
            assert f"in use by training, pid {running.pid}" in line
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing touched
        (out / "go").touch()
        stdout, stderr = running.communicate(timeout=300)
    finally:
        running.kill()
    assert running.returncode == 0, stderr[-3000:]
    assert same_weights(out, straight) and _train_steps(out) == list(range(1, 7))


def test_two_trainings_started_at_once_one_runs_the_other_is_refused(straight, tiny_toy_target, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train" / "medusa.py"), *_args(tiny_toy_target, out)]
    procs = [
        subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        for _ in range(2)
    ]
    results = [(p, *p.communicate(timeout=600)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 1], [(p.returncode, err[-2000:]) for p, _, err in results]
    loser = next(err for p, _, err in results if p.returncode == 1)
    assert "Traceback" not in loser
    assert "in use by training" in loser or "already holds checkpoint" in loser, loser[-2000:]
    assert same_weights(out, straight) and _train_steps(out) == list(range(1, 7))  # 6 records, not 12


# ---- a real full or read-only filesystem --------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MB tmpfs (the run takes about 8 MB): mounting needs root, which CI and the dev machines have."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _free_up(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    (disk / "filler").unlink(missing_ok=True)


def _checkpoint_bytes(straight: Path) -> int:
    return sum(p.stat().st_size for p in (straight / "checkpoint-2").rglob("*") if p.is_file())


def test_a_disk_too_full_for_the_next_checkpoint_stops_before_writing_it(
    straight, tiny_toy_target, small_disk
):
    out = small_disk / "run"
    free = _checkpoint_bytes(straight) // 2
    line = _one_error_line(_faulty(f"fill:4:{free}", tiny_toy_target, out))
    assert line.startswith(f"error: no space left on {out}: ") and "free, checkpoint-4 needs ~1.7 MB" in line
    assert "nothing was written and checkpoint-2 and earlier are intact" in line
    assert not (out / "checkpoint-4.tmp").exists() and (out / "checkpoint-2" / "manifest.json").is_file()
    _free_up(small_disk)
    _resumed_equals_straight(tiny_toy_target, out, straight)


def test_a_disk_that_fills_up_during_a_checkpoint_write_loses_nothing(straight, tiny_toy_target, small_disk):
    out = small_disk / "run"
    free = (
        _checkpoint_bytes(straight) // 2
    )  # the estimate is switched off: the write itself hits the full disk
    line = _one_error_line(_faulty(f"fill-unestimated:4:{free}", tiny_toy_target, out))
    assert line.startswith("error: writing checkpoint-4 failed: no space left on ") and "needs ~" in line
    assert "the partial checkpoint was removed and checkpoint-2 and earlier are intact" in line
    assert not (out / "checkpoint-4.tmp").exists()  # its space is given back
    _free_up(small_disk)
    _resumed_equals_straight(tiny_toy_target, out, straight)


def test_a_disk_too_full_for_final_keeps_the_last_checkpoint(straight, tiny_toy_target, small_disk):
    out = small_disk / "run"
    line = _one_error_line(_faulty("fill-final:100000", tiny_toy_target, out))
    assert (
        "writing final/ failed: no space left on" in line and "checkpoint-6 holds the trained drafter" in line
    )
    assert not (out / "final").exists() and not (out / "final.tmp").exists()
    _free_up(small_disk)
    _resumed_equals_straight(tiny_toy_target, out, straight)


def test_a_filesystem_turned_read_only_mid_run_loses_nothing(straight, tiny_toy_target, small_disk):
    out = small_disk / "run"
    line = _one_error_line(_faulty("readonly:4", tiny_toy_target, out))
    assert "writing checkpoint-4 failed:" in line and "read-only filesystem" in line
    assert (out / "checkpoint-2" / "manifest.json").is_file()
    _free_up(small_disk)
    _resumed_equals_straight(tiny_toy_target, out, straight)


def test_training_into_a_full_or_read_only_disk_is_refused_before_the_first_step(tiny_toy_target, small_disk):
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(small_disk).free - 500_000)
    line = _one_error_line(run_recipe(tiny_toy_target, small_disk / "run", *SHORT, check=False))
    assert "no space left on" in line and "a checkpoint and final/ needs ~" in line
    assert not list((small_disk / "run").glob("checkpoint-*"))
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    line = _one_error_line(run_recipe(tiny_toy_target, small_disk / "run2", *SHORT, check=False))
    assert "read-only filesystem" in line and str(small_disk) in line
    assert json.dumps(sorted(p.name for p in small_disk.iterdir())) == '["run"]'


# ---- stopped on request (Ctrl-C, a scheduler's SIGTERM) -----------------------------------------------------


def _stopped_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_ctrl_c_finishes_the_step_saves_it_and_the_resumed_run_is_bit_identical(
    straight, tiny_toy_target, tmp_path
):
    out = tmp_path / "run"
    line = _stopped_line(_faulty("signal:3:INT", tiny_toy_target, out))
    config = out / "config.yaml"
    assert line == (
        f"stopped at step 3 of 6; checkpoint-3 saved in {out}. Continue the run: draftsmith train medusa "
        f"--config {config} --resume. Or write the drafter of step 3 now, without training further: "
        f"draftsmith train medusa --config {config} --resume train.max_steps=3"
    )
    assert _train_steps(out) == [1, 2, 3]  # the step under way when the signal came was finished
    assert (out / "checkpoint-3" / "manifest.json").is_file() and not (out / "final").exists()
    assert not (out / LOCK_NAME).exists()
    _resumed_equals_straight(tiny_toy_target, out, straight)


def test_sigterm_stops_the_same_way_and_the_printed_command_writes_that_steps_drafter(
    tiny_toy_target, tmp_path
):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    line = _stopped_line(_faulty("signal:3:TERM", tiny_toy_target, out))
    command = shlex.split(line.split("without training further: ")[1])
    assert command[:3] == ["draftsmith", "train", "medusa"]
    cli = [sys.executable, "-m", "draftsmith.scripts.cli", *command[1:]]
    proc = subprocess.run(cli, env=env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _train_steps(out) == [1, 2, 3]  # no step ran
    final = load_file(str(out / "final" / "model.safetensors"))
    saved = load_file(str(out / "checkpoint-3" / "model.safetensors"))
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in final)


def test_a_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(tiny_toy_target, tmp_path):
    out = tmp_path / "run"
    line = _stopped_line(_faulty("signal:3:INT:2", tiny_toy_target, out))
    assert line == "interrupted"
    assert _train_steps(out) == [1, 2] and (out / "checkpoint-2" / "manifest.json").is_file()
    assert not (out / "checkpoint-3").exists() and not (out / "checkpoint-3.tmp").exists()


def test_a_sigterm_after_ctrl_c_still_stops_after_the_step(tiny_toy_target, tmp_path):
    """What `accelerate launch` does to its workers when the terminal sends Ctrl-C: a SIGTERM follows."""
    out = tmp_path / "run"
    line = _stopped_line(_faulty("signal:3:INT,TERM", tiny_toy_target, out))
    assert line.startswith("stopped at step 3 of 6;") and (out / "checkpoint-3" / "manifest.json").is_file()
