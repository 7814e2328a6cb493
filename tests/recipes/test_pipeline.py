"""`draftsmith pipeline` on the tiny toy target: online features, a training stage stopped at its deadline whose
checkpoint's drafter goes on to the evaluation and the export, and the command line's refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from draftsmith.scripts import pipeline, pipeline_plan


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """accelerate keeps one AcceleratorState per process (see test_quickstart.py)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_training_stopped_at_its_deadline_still_yields_a_measured_exported_drafter(
    tiny_toy_target, tmp_path, monkeypatch, capsys
):
    budget = pipeline_plan.Budget(prompts=8, answer_tokens=16, epochs=1.0, eval_prompts=2, eval_tokens=12)
    monkeypatch.setitem(pipeline_plan.BUDGETS, "short", budget)
    # training alone has a deadline, 4 s into a run of 10,000 epochs (tiny steps: dozens of checkpoints by then)
    shares = {"training": None}
    stages = [(n, f, shares.get(n)) for n, f, _ in pipeline.STAGES]
    monkeypatch.setattr(pipeline, "STAGES", tuple(stages))
    monkeypatch.setattr(
        pipeline, "stage_deadline", lambda name, minutes, share, start: 4.0 if name == "training" else None
    )
    out = tmp_path / "run"
    args = ["--target", str(tiny_toy_target), "--data", "stdlib:train", "--features", "online"]
    args += ["--output-dir", str(out), "--epochs", "10000", "--time-budget", "1", "--no-progress"]
    args += ["--serving-depth", "evaluator", "--export", "vllm,hf"]
    args += ["data.max_len=96", "train.micro_batch_size=2", "checkpoint.every=5", "log.every=5"]
    assert pipeline.main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    by_stage = {s["name"]: s for s in summary["stages"]}
    assert by_stage["training"]["outcome"] == "stopped at its deadline"
    assert [by_stage[n]["outcome"] for n in ("answers", "features", "evaluation", "export")] == ["done"] * 4
    assert by_stage["features"]["tokens"] is None and summary["features"] == "online"
    assert not any(out.glob("cache-*"))  # online: nothing stored
    run = next(out.glob("eagle3-*"))
    final = json.loads((run / "final" / "config.json").read_text())
    steps = max(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    assert final["training"]["steps"] == steps >= 5  # the drafter of the newest checkpoint
    report = json.loads((run / "final" / "eval.json").read_text())
    assert report["lossless"] and by_stage["evaluation"]["tokens"] == report["new_tokens"]
    assert (out / "export-vllm" / "config.json").is_file() and (out / "export-hf" / "config.json").is_file()
    assert "| training |" in printed and "stopped at its deadline" in printed


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--data", "my.jsonl"], "--heldout is required"),
        (["--data", "stdlib:train", "--answers", "ftp://x"], "--answers ftp://x: choose local, vllm"),
        (["--data", "stdlib:train", "--export", "vllm,triton"], "'triton' is not an engine"),
        (["--data", "stdlib:train", "--time-budget", "0"], "--time-budget must be"),
        (["--data", "stdlib:train", "--answer-tokens", "0"], "--answer-tokens"),
    ],
)
def test_bad_command_lines_are_refused_before_any_work(tiny_toy_target, tmp_path, capsys, extra, said):
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(["--target", str(tiny_toy_target), "--output-dir", str(tmp_path / "o"), *extra])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_target_is_required(capsys):
    with pytest.raises(SystemExit):
        pipeline.main(["--data", "prompts:train"])
    assert "--target is required" in capsys.readouterr().err


def test_a_hub_id_passes_through_to_the_loader(tmp_path, monkeypatch):
    from draftsmith.scripts.pipeline_target import resolve_target

    monkeypatch.chdir(tmp_path)
    assert resolve_target("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        tmp_path.joinpath("HuggingFaceTB/SmolLM2-135M-Instruct").relative_to(tmp_path),
        False,
    )
    with pytest.raises(FileNotFoundError, match="a Hub id ORG/NAME"):
        resolve_target("no-such-dir")


def test_the_answers_batch_fills_a_share_of_the_gpu_memory(tiny_toy_target, monkeypatch):
    """On a GPU the batch is what the KV caches of prompt + answer fit in 60 % of the free memory, by hand: the
    tiny target's 8 layers x 2 x kv heads x head dim x 2 bytes a token."""
    import torch
    from transformers import AutoConfig

    from draftsmith.scripts import pipeline_memory

    config = AutoConfig.from_pretrained(tiny_toy_target)
    kv_heads = config.num_key_value_heads
    per_token = (
        2 * config.num_hidden_layers * kv_heads * (config.hidden_size // config.num_attention_heads) * 2
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    free = 1000 * per_token * (768 + 256)  # room for 1,000 caches
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free, 2 * free))
    assert pipeline_memory.answer_batch_size(tiny_toy_target, 256, "bfloat16") == 600
    assert pipeline_memory.answer_batch_size(tiny_toy_target, 256, "float32") == 300
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 * free, 200 * free))
    assert pipeline_memory.answer_batch_size(tiny_toy_target, 256, "bfloat16") == 1024  # the cap
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pipeline_memory.answer_batch_size(tiny_toy_target, 256, "bfloat16") == 64  # a CPU's, measured


def test_answers_stopped_at_their_deadline_train_the_drafter_on_what_was_kept(
    tiny_toy_target, tmp_path, monkeypatch
):
    """The answers' deadline keeps every finished batch; the features and training go on with those, and a
    rerun of the same command resumes the answers where they stopped."""
    budget = pipeline_plan.Budget(prompts=3000, answer_tokens=16, epochs=1.0, eval_prompts=1, eval_tokens=8)
    monkeypatch.setitem(pipeline_plan.BUDGETS, "short", budget)
    monkeypatch.setattr(pipeline, "stage_deadline", lambda name, *_: 3.0 if name == "answers" else None)
    out = tmp_path / "run"
    args = ["--target", str(tiny_toy_target), "--data", "stdlib:train", "--output-dir", str(out)]
    args += ["--time-budget", "1", "--no-progress", "--serving-depth", "evaluator", "--export", "none"]
    args += ["data.max_len=96", "train.micro_batch_size=4", "train.max_steps=3"]
    assert pipeline.main(args) == 0
    summary = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["stages"]}
    assert summary["answers"]["outcome"] == "stopped at its deadline"
    meta = json.loads((out / "data" / "answers.jsonl.meta.json").read_text())
    kept = len((out / "data" / "answers.jsonl").read_text().splitlines())
    assert 0 < kept == meta["counts"]["written"] < 3000
    assert summary["answers"]["tokens"] == meta["runs"][-1]["counts"]["completion_tokens"] > 0
    assert summary["features"]["outcome"] == summary["training"]["outcome"] == "done"
    assert summary["export"]["outcome"] == "done" and not any(out.glob("export-*"))
    run = next(out.glob("eagle3-3000-*"))
    config = json.loads((run / "final" / "config.json").read_text())
    assert list(config["training"]["data_sha256"]) == [str(out / "data" / "answers.jsonl")]


@pytest.mark.parametrize("source", ["local", "vllm", "http://127.0.0.1:8000/v1"])
def test_every_answer_source_makes_a_command_line_regenerate_accepts(tiny_toy_target, tmp_path, source):
    """The answers stage's `data regenerate` flags for each --answers pass its own checks (a served model's
    dtype is the server's: --dtype would be refused with --endpoint)."""
    from draftsmith.scripts.data import regenerate
    from draftsmith.scripts.pipeline_stages import answer_source

    plan = pipeline_plan.Plan(
        tiny_toy_target,
        pipeline_plan.TOY_DATA,
        "float32",
        pipeline_plan.BUDGETS["short"],
        tmp_path,
        [],
        False,
    )
    plan = dataclasses.replace(plan, answers_from=source)
    argv = [*answer_source(plan), "--data", "stdlib:train", "--out", str(tmp_path / "a.jsonl")]
    settings = regenerate.parse_args(argv)
    assert ("--dtype" in argv) == (source in ("local", "vllm"))
    if source == "local":
        assert settings.batch_size == 64 and settings.compile == "auto"
    assert (
        (settings.endpoint == source)
        if source.startswith("http")
        else (settings.target == str(tiny_toy_target))
    )
