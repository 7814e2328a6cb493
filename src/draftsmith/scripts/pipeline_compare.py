"""The pipeline's evaluation table: the trained drafter (as a chain and as a tree) next to ngram, each decoded
speculatively on the same held-out prompts against one plain decoding of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from draftsmith.eval.acceptance import EvalArgs, evaluate, per_prompt_verdicts
from draftsmith.eval.depth import recalibrated, report_off_reason
from draftsmith.eval.report import TurnResult, summarize
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.runtime.display import fmt_value, table
from draftsmith.runtime.files import write_json


def compare_drafters(
    target_dir: Path, drafter_dir: Path, data: str, num_prompts: int, max_new_tokens: int, progress: bool
) -> str:
    """Evaluate the trained drafter (chain and tree) and the ngram baseline (chain) on the same prompts; save
    the drafter's chain report in its checkpoint (final/eval.json) and return the table.

    ngram runs as a chain only: prompt lookup in vLLM, SGLang and TGI proposes one continuation, so a tree of
    n-gram matches is a baseline no engine serves (on the short budget's prompts its tau was 1.37 against the
    chain's 1.29, for 1 min 19 s more of the stage with AVX2 kernels: docs/BENCHMARKS.md, "Prompt lookup as a
    chain, and what a verification costs").

    Plain decoding runs once, beside the first row: every row's speedup is against it and every row's answers
    are checked against its greedy answers (the same prompts, the same target), instead of decoding plainly
    four times."""
    target = FrozenTarget.load(TargetConfig(path=str(target_dir)))  # once, for every row
    rows: list[tuple[str, str, dict[str, Any]]] = []
    plain: list[TurnResult] = []
    plain_rate = 0.0
    for drafter, tree in [
        (str(drafter_dir), "chain"),
        (str(drafter_dir), "topk:3"),
        ("ngram", "chain"),
    ]:
        first = not plain
        eval_args = EvalArgs(
            target=str(target_dir),
            drafter=drafter,
            data=data,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            depth=5,
            tree=tree,
            baseline=first,
            check_lossless=first,
            progress=progress,
        )
        turns: list[TurnResult] = []
        report = evaluate(eval_args, target, record=turns)
        if first:  # the evaluator's own baseline, speedup and lossless verdict
            plain, plain_rate = turns, report["baseline_tokens_per_s"]
            write_json(drafter_dir / "eval.json", report)
        else:
            report.update(against_plain(turns, plain))
            report.update(
                recalibrated(report, 5, plain_rate)
            )  # its depth prediction against the same plain rate
        rows.append(("EAGLE-3 (trained)" if drafter != "ngram" else "ngram (prompt lookup)", tree, report))
    return results_table(rows, drafter_dir / "eval.json")


def against_plain(turns: list[TurnResult], plain: list[TurnResult]) -> dict[str, Any]:
    """`speedup` and `lossless` of a row decoded without a baseline, against the plain decoding of an earlier
    row of the same prompts, by the evaluator's own rules (eval/report.py `summarize`, the evaluator's
    lossless check)."""
    paired = [dataclasses.replace(t, baseline=p.baseline) for t, p in zip(turns, plain, strict=True)]
    _, lossless = per_prompt_verdicts(paired, check_lossless=True)
    return {"speedup": summarize(paired)["speedup"], "lossless": lossless}


def depth_cell(report: dict[str, Any]) -> str:
    """A chain row's recommended depth and its expected speedup ('-' for a tree: its acceptance is the tree's)."""
    depth = report.get("recommended_depth")
    if depth is None:
        return "-"
    return f"{depth} ({report['recommended_speedup']:.2f}x)" if depth else "off"


def results_table(rows: list[tuple[str, str, dict[str, Any]]], report: Path) -> str:
    """The quickstart's closing table: a row per drafter and tree (tau, alpha, speedup, lossless)."""
    cells = [
        (
            name,
            tree,
            fmt_value(r["tau"]),
            fmt_value(r["alpha"]),
            f"{r['speedup']:.2f}x",
            depth_cell(r),
            r["lossless"],
        )
        for name, tree, r in rows
    ]
    header = ["drafter", "tree", "tau", "alpha", "speedup", "depth (evaluator's costs)", "lossless"]
    lines = table(header, cells)
    lines.append(
        f"(tau = tokens per target forward, 1.00 = plain decoding; depth 5; speedup = tokens/s against plain "
        f"decoding on this machine; depth = the chain depth with the highest expected speedup from this run's "
        f"acceptance and the measured costs of draftsmith's evaluator loop (Python, one draft step at a time), "
        f"'off' where none beats plain decoding there: a serving engine's costs differ, and `draftsmith "
        f"engine-eval --engine vllm --depths 1,2,3` measures vLLM's; report: {report})"
    )
    off = [r for name, tree, r in rows if name != "ngram (prompt lookup)" and r.get("recommended_depth") == 0]
    reason = report_off_reason(off[0]) if off else None
    if reason:
        lines.append(f"EAGLE-3 is off at the evaluator's costs: {reason}")
    return "\n".join(lines)
