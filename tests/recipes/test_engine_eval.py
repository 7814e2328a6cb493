"""The closed loop with a real engine: an EAGLE-3 drafter trained on the `tiny` toy target, exported and served
in vLLM (the CPU build in the venv `draftsmith engine-setup vllm` makes), measured by vLLM and by draftsmith's
evaluator on the same prompts. vLLM's mean acceptance length must be within 3 % of the evaluator's tau and its
speculative answers equal to its plain greedy answers.

Without a set-up engine the test is skipped, unless DRAFTSMITH_REQUIRE_ENGINE=1 (scripts/test.sh sets it after
setting the engine up), where a missing engine fails it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _run import env, run_recipe

pytestmark = pytest.mark.engine


def test_vllm_measures_the_tau_draftsmith_measures(vllm_env, tiny_toy_target, tmp_path):
    run_recipe(tiny_toy_target, tmp_path / "run", method="eagle", recipe="eagle/eagle3_tiny.yaml")
    report = tmp_path / "engine.json"
    cmd = [
        *(sys.executable, "-m", "draftsmith.scripts.cli", "engine-eval", "--engine", "vllm"),
        *("--target", str(tiny_toy_target), "--drafter", str(tmp_path / "run" / "final")),
        *("--data", "stdlib:heldout", "--num-prompts", "6", "--max-new-tokens", "48", "--depth", "3"),
        *("--report", str(report), "--work-dir", str(tmp_path / "work"), "--no-progress"),
    ]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    r = json.loads(report.read_text())
    tau_vllm, tau_ours = r["vllm"]["mean_acceptance_length"], r["draftsmith"]["tau"]
    assert tau_ours > 1.2  # a trained drafter: the agreement below is about accepted drafts, not all rejected
    assert abs(tau_vllm - tau_ours) <= 0.03 * tau_ours, proc.stdout
    assert r["vllm"]["speculative_equals_plain"] == r["answers"] == 6 and r["lossless"] is True
    assert r["vllm"]["counters"]["num_draft_tokens"] == 3 * r["vllm"]["counters"]["num_drafts"]
    assert "relative difference, vLLM vs the evaluator" in proc.stdout
