"""`eval.select: best` and `eval.patience`: final/ holds the weights of the held-out evaluation with the highest
tau estimate, checked against the run's own checkpoint of that step; patience stops the run early."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from draftsmith.train import eagle
from draftsmith.train.core.settings import EvalConfig

RECIPE = "recipes/eagle/eagle3_tiny.yaml"


def train(target, out, *overrides: str) -> None:
    args = ["--config", RECIPE, f"target.path={target}", f"output_dir={out}", "train.lr=0.03", "log.every=1"]
    assert eagle.main([*args, "checkpoint.every=1", "checkpoint.keep_last=0", *overrides]) == 0


def evaluations(out) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/tau_estimate"] for r in rows if "eval/tau_estimate" in r and r["step"] > 0}


@pytest.mark.parametrize(("patience", "steps"), [(0, 3), (1, 8)])
def test_final_holds_the_best_evaluations_weights(tiny_toy_target, tmp_path, patience, steps):
    out = tmp_path / "run"
    train(
        tiny_toy_target,
        out,
        f"train.max_steps={steps}",
        "eval.every=1",
        "eval.select=best",
        f"eval.patience={patience}",
    )
    scores = evaluations(out)
    best = max(scores, key=lambda step: (scores[step], -step))  # the first of equal estimates is kept
    config = json.loads((out / "final" / "config.json").read_text())
    chosen = config["training"]["selection"]
    assert chosen["selected_step"] == best and chosen["eval/tau_estimate"] == pytest.approx(scores[best])
    final = load_file(out / "final" / "model.safetensors")
    kept = load_file(out / f"checkpoint-{best}" / "model.safetensors")
    assert final.keys() <= kept.keys() and all((final[k] == kept[k]).all() for k in final)
    last = max(scores)
    if patience:  # stopped after the first evaluation that was no better than the best
        worse = [s for s in sorted(scores) if s > best]
        assert last == (worse[0] if worse else steps) and config["training"]["steps"] == last
    if (
        best != last
    ):  # (on this machine: best step 2 of 3, estimates 1.075, 1.079, 1.077) not the last weights
        at_last = load_file(out / f"checkpoint-{last}" / "model.safetensors")
        assert any((final[k] != at_last[k]).any() for k in final)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="set eval.every > 0"):
        EvalConfig(select="best")
    with pytest.raises(ValueError, match="'last' or 'best'"):
        EvalConfig(select="top", every=5)
    with pytest.raises(ValueError, match="eval.patience"):
        EvalConfig(patience=2)
