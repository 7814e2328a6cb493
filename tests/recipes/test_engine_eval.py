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


@pytest.mark.slow  # about 4 minutes: two vLLM servers at two concurrencies and two context lengths; the closed loop
# above keeps vLLM in the default run
def test_speedup_curves_over_concurrency_and_context_in_vllms_server(vllm_env, tiny_toy_target, tmp_path):
    """The n-gram proposer (nothing to train) against plain serving: every level decodes the same answers (equal
    completion tokens at T = 0), and the verdict is the rule applied to the measured rows."""
    from draftsmith.engines.load_curves import stops_paying

    report, plot = tmp_path / "engine.json", tmp_path / "curves.png"
    cmd = [
        *(sys.executable, "-m", "draftsmith.scripts.cli", "engine-eval", "--engine", "vllm"),
        *("--target", str(tiny_toy_target), "--drafter", "ngram", "--data", "stdlib:heldout"),
        *("--num-prompts", "4", "--max-new-tokens", "32", "--concurrency", "1,4"),
        *("--context-lengths", "256,768", "--context-prompts", "2", "--enforce-eager"),
        *(
            "--report",
            str(report),
            "--plot",
            str(plot),
            "--work-dir",
            str(tmp_path / "work"),
            "--no-progress",
        ),
    ]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    curves = json.loads(report.read_text())["curves"]
    assert [r["concurrency"] for r in curves["concurrency"]] == [1, 4]
    assert [r["context_tokens"] for r in curves["context_tokens"]] == [256, 768]
    for name in ("concurrency", "context_tokens"):
        for row in curves[name]:
            assert row["tokens"]["plain"] == row["tokens"]["speculative"] > 0  # lossless in the server too
            assert row["speedup"] == pytest.approx(row["spec_tokens_per_s"] / row["plain_tokens_per_s"])
            assert row["mean_acceptance_length"] is None or row["mean_acceptance_length"] >= 1
        assert curves["stops_paying"][name] == stops_paying(curves[name], name)
    assert all(r["prompt_tokens"] <= r["context_tokens"] for r in curves["context_tokens"])
    assert curves["context_tokens"][1]["prompt_tokens"] > 700  # real text filled to length
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| requests in flight | tokens/s plain |" in proc.stdout
