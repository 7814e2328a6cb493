"""The pipeline's stages after the target: the target's answers, its features, training, evaluation and export.

Each stage is a draftsmith command run in this process (`data regenerate`, `cache`, `train eagle`, `eval`,
`export`), resumable as that command is, and returns its exit status; what it did is read back from the files
it wrote (`stage_tokens`), so a stage stopped at its deadline is counted like one that finished.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from draftsmith.data.regen_output import META_SUFFIX
from draftsmith.scripts.data import regenerate
from draftsmith.scripts.pipeline_compare import compare_drafters
from draftsmith.scripts.pipeline_memory import answer_batch_size
from draftsmith.scripts.pipeline_plan import SAMPLING, Plan
from draftsmith.scripts.pipeline_serving import serving_verdict
from draftsmith.ship import export
from draftsmith.train import eagle
from draftsmith.train.cache import build
from draftsmith.train.core.metrics import read_metrics

EVAL_REPORT = "eval.json"  # the drafter's chain report, in final/


def answer_prompts(plan: Plan) -> int:
    """The target's greedy answers to the training prompts, then budget.sampled sampled answers to the same
    prompts, each set in a file of its own (`draftsmith data regenerate`, resumable)."""
    budget, data = plan.budget, plan.data
    extra = f", and {budget.sampled} sampled (T {SAMPLING['temperature']:g})" if budget.sampled else ""
    print(
        f"[2/6] the target's greedy answers to {budget.prompts} prompts ({data['train']}){extra}: {plan.answers}"
    )
    sets = [(plan.answers, ["--temperature", "0"])]
    for seed in range(1, budget.sampled + 1):
        sampling = ["--temperature", str(SAMPLING["temperature"]), "--top-p", str(SAMPLING["top_p"])]
        sets.append((plan.sampled_answers(seed), [*sampling, "--seed", str(seed)]))
    for out, sampling in sets:
        regen = [*answer_source(plan), "--data", data["train"], "--out", str(out), *sampling]
        regen += ["--max-new-tokens", str(budget.answer_tokens), "--max-samples", str(budget.prompts)]
        regen += [] if plan.progress else ["--no-progress"]
        code = regenerate.main(regen)
        if code != 0:
            return code
    return 0


def answer_source(plan: Plan) -> list[str]:
    """`data regenerate`'s flags for where the answers come from: this process (in `plan.dtype`, its batch
    sized to the device), vLLM served for the stage, or a server already running."""
    if plan.answers_from == "local":
        batch = answer_batch_size(plan.target, plan.budget.answer_tokens, plan.dtype)
        local = ["--batch-size", str(batch), "--compile", plan.compile]
        return ["--target", str(plan.target), "--dtype", plan.dtype, *local]
    if plan.answers_from == "vllm":
        return ["--target", str(plan.target), "--dtype", plan.dtype, "--serve", "vllm"]
    return ["--endpoint", plan.answers_from]  # the server's own dtype: --dtype is refused with it


def cache_features(plan: Plan) -> int:
    """The target's features at EAGLE-3's layers, stored once (`draftsmith cache`); nothing with online
    features, which training computes at every step."""
    if plan.features == "online":
        print("[3/6] features: online (training runs the target at every step; nothing stored)")
        return 0
    print(f"[3/6] the target's features for EAGLE-3: {plan.cache}")
    dtype = f"target.dtype={plan.dtype}"
    return build.main(["eagle", "--config", plan.recipe, *plan.common, dtype, *plan.overrides])


def training_settings(plan: Plan) -> list[str]:
    precision = f"train.mixed_precision={'bf16' if plan.dtype == 'bfloat16' else 'no'}"
    target_dtype = [] if plan.features == "cache" else [f"target.dtype={plan.dtype}"]
    settings = [f"output_dir={plan.run_dir}", f"train.epochs={plan.budget.epochs}", precision, *target_dtype]
    if plan.micro_batch is not None:
        settings += [f"train.micro_batch_size={plan.micro_batch}", "train.grad_accum=1"]
    return ["--config", plan.recipe, *plan.common, *settings, *plan.overrides]


def train_eagle3(plan: Plan) -> int:
    """EAGLE-3 trained on the answers, resuming a run that stopped (`draftsmith train eagle`)."""
    epochs, recipe = plan.budget.epochs, plan.budget.recipe
    print(
        f"[4/6] training EAGLE-3 ({epochs:g} epochs, recipes/eagle/{recipe}, {plan.features}): {plan.run_dir}"
    )
    return eagle.main([*training_settings(plan), "--resume"])


def finish_stopped_training(plan: Plan) -> int:
    """The drafter of the newest checkpoint written to final/, for a training stage stopped at its deadline
    (the run's own `--resume train.max_steps=STEP`); 1 where it stopped before its first checkpoint."""
    steps = [
        int(m.group(1)) for p in plan.run_dir.glob("checkpoint-*") if (m := re.search(r"-(\d+)$", p.name))
    ]
    if not steps:
        print(f"training stopped before its first checkpoint; rerun to continue it ({plan.run_dir})")
        return 1
    print(
        f"      training stopped at its deadline: the drafter of step {max(steps)} goes on to the evaluation"
    )
    return eagle.main([*training_settings(plan), f"train.max_steps={max(steps)}", "--resume"])


def evaluate_drafter(plan: Plan) -> int:
    """The trained EAGLE-3 next to ngram by speculative decoding of held-out prompts; prints the table and the
    depth to serve with."""
    budget, heldout = plan.budget, plan.data["heldout"]
    print(f"[5/6] speculative decoding of {budget.eval_prompts} held-out prompts ({heldout}), greedy")
    final = plan.run_dir / "final"
    results = compare_drafters(
        plan.target, final, heldout, budget.eval_prompts, budget.eval_tokens, plan.progress
    )
    print(results)
    verdict = serving_verdict(
        plan.serving, plan.target, final, heldout, budget.eval_prompts, budget.eval_tokens, plan.progress
    )
    print(verdict)
    return 0


def export_drafter(plan: Plan) -> int:
    """The trained drafter in each engine layout of `plan.export` (`draftsmith export`, validated there)."""
    if not plan.export:
        print("[6/6] export: none asked for (--export none)")
        return 0
    print(f"[6/6] export for {', '.join(plan.export)}: {plan.out / 'export-ENGINE'}")
    for engine in plan.export:
        code = export.main(
            [str(plan.run_dir / "final"), "--to", engine, "--out", str(plan.out / f"export-{engine}")]
        )
        if code != 0:
            return code
    return 0


def stage_tokens(name: str, plan: Plan, mark: list[int]) -> int | None:
    """The tokens a stage handled, from what it wrote: answers generated (each answers file's runs after its
    `mark`), features stored (the cache's index; 0 if it was complete before), tokens trained on (metrics.jsonl's records after the step
    `mark` holds), tokens decoded by the drafter's chain; None where a stage handles none."""
    if name == "answers":
        runs = [answer_runs(p)[k:] for p, k in zip(plan.planned_answer_files, mark, strict=True)]
        return sum(int(r["counts"].get("completion_tokens", 0)) for file_runs in runs for r in file_runs)
    if name == "features" and plan.features == "cache" and (index := plan.cache / "index.json").is_file():
        stored = sum(int(s["tokens"]) for s in json.loads(index.read_text())["splits"].values())
        return 0 if mark[0] else stored  # complete before the stage: nothing computed now
    if name == "training" and (metrics := plan.run_dir / "metrics.jsonl").is_file():
        return int(sum(r.get("perf/tokens", 0) for r in read_metrics(metrics) if r["step"] > mark[0]))
    if name == "evaluation" and (report := plan.run_dir / "final" / EVAL_REPORT).is_file():
        return int(json.loads(report.read_text())["new_tokens"])
    return None


def stage_mark(name: str, plan: Plan) -> list[int]:
    """Where a stage starts, for `stage_tokens`: each answers file's run count; whether the cache was complete;
    the run's last logged step."""
    if name == "answers":
        return [len(answer_runs(p)) for p in plan.planned_answer_files]
    if name == "training" and (metrics := plan.run_dir / "metrics.jsonl").is_file():
        return [max((r["step"] for r in read_metrics(metrics)), default=0)]
    if name == "features" and plan.features == "cache":
        return [int((plan.cache / "index.json").is_file())]
    return [0]


def answer_runs(answers: Path) -> list[dict]:
    """The runs an answers file's meta records (`data regenerate` appends one per run, with its counts)."""
    meta = answers.with_name(answers.name + META_SUFFIX)
    return json.loads(meta.read_text()).get("runs", []) if meta.is_file() else []
