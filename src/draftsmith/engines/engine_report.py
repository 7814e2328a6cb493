"""engine-eval's comparison: the evaluator's steps in vLLM's terms, the report of both engines' figures, and
its Markdown table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.runtime.display import fmt_value, pyplot, table

from .depth_check import measured_off_reason
from .settings import EngineEvalArgs
from .vllm_engine import VllmRun


def comparable(turns: Sequence[Any]) -> dict[str, Any]:
    """The evaluator's steps in vLLM's terms: steps that carried drafts, accepted draft tokens, and the
    unconditional acceptance by position."""
    steps = [s for t in turns for s in t.spec.steps]
    drafted = [s for s in steps if s.draft_tokens > 0]
    depth = max((s.depth for s in drafted), default=0)
    n = len(drafted)
    return {
        "num_steps": len(steps),
        "num_drafts": n,
        "num_draft_tokens": sum(s.draft_tokens for s in drafted),
        "num_accepted_tokens": sum(s.accepted for s in drafted),
        "mean_acceptance_length": 1 + sum(s.accepted for s in drafted) / n if n else None,
        "acceptance_by_position": [sum(s.accepted >= d for s in drafted) / n for d in range(1, depth + 1)]
        if n
        else [],
    }


def build_report(
    args: EngineEvalArgs,
    kind: str,
    ours: dict[str, Any],
    turns: list[Any],
    plain: VllmRun,
    spec_run: VllmRun,
    spec: dict[str, Any],
    package: str,
    cpu_settings: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Both engines' figures for the same prompts, their agreement on tau, and the lossless checks; with the
    environment settings vLLM ran under where given (vllm_engine.py `speed_settings`)."""
    mine = comparable(turns)
    greedy = args.temperature == 0
    same_as_plain = [
        a["token_ids"] == b["token_ids"] for a, b in zip(spec_run.outputs, plain.outputs, strict=True)
    ]
    same_as_ours = [o["token_ids"] == t.spec.tokens for o, t in zip(spec_run.outputs, turns, strict=True)]
    return {
        "drafter": args.drafter,
        "kind": kind,
        "engine": {
            "package": package,
            "version": spec_run.version,
            "speculative_config": spec,
            "cpu_settings": cpu_settings,
        },
        "settings": report_settings(args, ours),
        "measured": ours.get("measured"),  # the drafter, target and data the evaluator measured alike
        "vllm": vllm_figures(plain, spec_run, sum(same_as_plain) if greedy else None),
        "draftsmith": evaluator_figures(ours, mine),
        "answers": len(turns),
        "answers_equal_across_engines": sum(same_as_ours) if greedy else None,
        **tau_agreement(args, ours, mine, spec_run),
        "lossless": (all(same_as_plain) and ours["lossless"] is not False) if greedy else None,
    }


def report_settings(args: EngineEvalArgs, ours: dict[str, Any]) -> dict[str, Any]:
    """The settings both engines decoded with (the depth the evaluator chose)."""
    return {
        k: getattr(args, k)
        for k in ("target", "data", "num_prompts", "max_new_tokens", "temperature", "top_p", "top_k")
    } | {
        "depth": ours["settings"]["depth"],
        "draft_sample_method": args.draft_sample_method,
        "batch_size": args.batch_size,
        "max_rel_diff": args.max_rel_diff,
    }


def vllm_figures(plain: VllmRun, spec_run: VllmRun, equals_plain: int | None) -> dict[str, Any]:
    """vLLM's figures: its acceptance, counters, speed with and without the drafter, and (at T = 0) how many
    speculative answers equal the plain ones."""
    speedup = (
        spec_run.tokens_per_s / plain.tokens_per_s if spec_run.tokens_per_s and plain.tokens_per_s else None
    )
    return {
        "mean_acceptance_length": spec_run.mean_acceptance_length,
        "acceptance_by_position": spec_run.acceptance_by_position,
        "counters": spec_run.counters,
        "tokens_per_s": spec_run.tokens_per_s,
        "plain_tokens_per_s": plain.tokens_per_s,
        "speedup": speedup,
        "new_tokens": spec_run.tokens,
        "load_s": {"plain": plain.load_s, "speculative": spec_run.load_s},
        "speculative_equals_plain": equals_plain,
    }


def evaluator_figures(ours: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """The evaluator's figures, with its steps counted as vLLM counts them (`mine`, from `comparable`)."""
    return {
        "tau": ours["tau"],
        "tau_stderr": ours["tau_stderr"],
        "alpha": ours["alpha"],
        "acceptance_by_depth": ours["acceptance_by_depth"],
        "draft_time_s": ours["draft_time_s"],
        "verify_time_s": ours["verify_time_s"],
        "vllm_definition": mine,
        "tokens_per_s": ours["tokens_per_s"],
        "plain_tokens_per_s": ours["baseline_tokens_per_s"],
        "speedup": ours["speedup"],
        "new_tokens": ours["new_tokens"],
        "lossless": ours["lossless"],
    }


def tau_agreement(
    args: EngineEvalArgs, ours: dict[str, Any], mine: dict[str, Any], spec_run: VllmRun
) -> dict[str, Any]:
    """vLLM's tau against the evaluator's, as it is and counted alike, and whether they agree within the
    tolerance."""
    tau_vllm, tau_ours = spec_run.mean_acceptance_length, ours["tau"]
    rel = (tau_vllm - tau_ours) / tau_ours if tau_vllm is not None and tau_ours else None
    # the like-for-like figure: the evaluator's steps counted as vLLM counts them (steps that carried drafts);
    # equal to tau when every step drafts, which only the n-gram proposer does not do
    same = mine["mean_acceptance_length"]
    rel_same = (tau_vllm - same) / same if tau_vllm is not None and same else None
    # At T > 0 the engines sample different answers: two independent estimates of tau, each with about the
    # evaluator's standard error, so their difference is allowed 3 standard errors of a difference as well.
    tolerance = args.max_rel_diff
    if args.temperature != 0 and ours["tau_stderr"] and same:
        tolerance = max(tolerance, 3 * math.sqrt(2) * ours["tau_stderr"] / same)
    return {
        "tau_relative_difference": rel,
        "same_definition_relative_difference": rel_same,
        "tolerance": tolerance,
        "tau_agrees": rel_same is not None and abs(rel_same) <= tolerance,
    }


def cell(x: Any, digits: int = 3) -> str:
    """A report value for a Markdown cell (`fmt_value`); a list (acceptance by position) as "0.35 / 0.13"."""
    if isinstance(x, list):
        return " / ".join(fmt_value(v, 2) for v in x) or "-"
    return fmt_value(x, digits)


def comparison_rows(r: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The table's rows: what is compared, vLLM's figure, the evaluator's."""
    v, d = r["vllm"], r["draftsmith"]
    alike = d["vllm_definition"]
    rows = [
        ("tau (vLLM: mean acceptance length)", v["mean_acceptance_length"], d["tau"]),
        (
            "the same in vLLM's terms (steps with drafts only)",
            v["mean_acceptance_length"],
            alike["mean_acceptance_length"],
        ),
        (
            "acceptance by position (unconditional)",
            v["acceptance_by_position"],
            alike["acceptance_by_position"],
        ),
        (
            "steps with drafts / draft tokens / accepted",
            f"{v['counters']['num_drafts']} / {v['counters']['num_draft_tokens']} / {v['counters']['num_accepted_tokens']}",
            f"{alike['num_drafts']} / {alike['num_draft_tokens']} / {alike['num_accepted_tokens']}",
        ),
        (
            "tokens/s with the drafter / plain",
            f"{cell(v['tokens_per_s'], 1)} / {cell(v['plain_tokens_per_s'], 1)}",
            f"{cell(d['tokens_per_s'], 1)} / {cell(d['plain_tokens_per_s'], 1)}",
        ),
        ("speedup", v["speedup"], d["speedup"]),
    ]
    if v["speculative_equals_plain"] is not None:
        rows.append(
            (
                "answers equal to plain greedy decoding",
                f"{v['speculative_equals_plain']}/{r['answers']}",
                "all" if d["lossless"] else "NOT all",
            )
        )
    return rows


def markdown(r: dict[str, Any]) -> str:
    """The comparison as the command prints it: a headline, the table, the verdict on tau, the curves."""
    n, settings = r["answers"], r["settings"]
    sampled = settings["temperature"] > 0
    head = (
        f"{r['kind']} drafter, {r['engine']['package']} {r['engine']['version']} vs draftsmith's evaluator: "
        f"{n} answers, depth {settings['depth']}, T={settings['temperature']}"
        + (f" ({settings['draft_sample_method']} drafts)" if sampled else "")
        + f", chain, batch {settings['batch_size']} in vLLM, 1 in the evaluator"
    )
    bound = (r["engine"].get("cpu_settings") or {}).get("VLLM_CPU_OMP_THREADS_BIND")
    head += f"; vLLM's OpenMP threads on CPUs {bound}" if bound else ""
    rows = [(k, cell(a), cell(b)) for k, a, b in comparison_rows(r)]
    lines = [head, "", *table(["", "vLLM", "draftsmith"], rows), ""]
    rel, same = r["tau_relative_difference"], r["same_definition_relative_difference"]
    agreement = "agree" if r["tau_agrees"] else "DISAGREE"
    lines.append(
        f"relative difference, vLLM vs the evaluator's tau: {cell(rel * 100 if rel is not None else None, 2)} %; "
        f"counted alike (steps with drafts): {cell(same * 100 if same is not None else None, 2)} % ({agreement}; "
        f"limit {r['tolerance'] * 100:.1f} %"
        + (", 3 standard errors of the difference of two sampled runs)" if sampled else ")")
    )
    lines += curves_markdown(r.get("curves") or {})
    if "depth_check" in r:
        lines += depth_markdown(r["depth_check"], n)
    if r["answers_equal_across_engines"] is not None:
        lines.append(
            f"answers identical in both engines: {r['answers_equal_across_engines']}/{n} "
            "(float32 in both; a near-tie may round differently in vLLM's kernels)"
        )
    return "\n".join(lines)


CURVE_TITLES = {
    "concurrency": "requests in flight",
    "context_tokens": "prompt tokens (one request at a time)",
}


def curves_markdown(curves: dict[str, Any]) -> list[str]:
    """The speedup curves as tables, each with the level from which speculation stops paying."""
    lines: list[str] = []
    for name, title in CURVE_TITLES.items():
        if name not in curves:
            continue
        header = [
            title,
            "tokens/s plain",
            "tokens/s with the drafter",
            "speedup",
            "vLLM mean acceptance length",
        ]
        cells = [
            (
                row[name],
                cell(row["plain_tokens_per_s"], 1),
                cell(row["spec_tokens_per_s"], 1),
                cell(row["speedup"], 2),
                cell(row["mean_acceptance_length"], 2),
            )
            for row in curves[name]
        ]
        lines += ["", *table(header, cells)]
        lines.append(verdict(curves, name))
    return lines


def depth_markdown(check: dict[str, Any], answers: int) -> list[str]:
    """The --depths table: the prediction against vLLM's measured speedup per K, and the verdict."""
    header = [
        "depth K",
        "tau predicted",
        "tau vLLM",
        "speedup predicted for vLLM",
        "speedup measured in vLLM",
        "difference",
        "speedup at the evaluator's costs",
        "answers equal to plain",
    ]
    cells = [
        (
            f"{row['depth']}" + (" (calibration)" if row["depth"] == check["calibrated_at"] else ""),
            cell(row["tau_predicted"]),
            cell(row["tau_vllm"]),
            cell(row["speedup_predicted"], 2),
            cell(row["speedup_measured"], 2),
            "-" if row["relative_difference"] is None else f"{row['relative_difference'] * 100:+.1f} %",
            cell(row["speedup_evaluator_costs"], 2),
            f"{row['speculative_equals_plain']}/{answers}",
        )
        for row in check["rows"]
    ]
    worst = check["max_relative_difference"]
    verdict_line = (
        "the depth prediction: "
        + ("-" if worst is None else f"largest difference {worst * 100:.1f} %")
        + f" (limit {check['tolerance'] * 100:.0f} %, "
        + ("within" if check["within_tolerance"] else "MISSED")
        + f"); fastest depth predicted {check['recommended_depth']}, measured {check['fastest_measured_depth']}"
    )
    lines = ["", *table(header, cells), verdict_line]
    fastest = next((r for r in check["rows"] if r["depth"] == check["fastest_measured_depth"]), None)
    if fastest is not None and fastest["speedup_measured"] <= 1.0:
        lines.append(f"speculation off in vLLM: no depth beat plain decoding; {measured_off_reason(check)}")
    return lines


def verdict(curves: dict[str, Any], name: str) -> str:
    """Where speculation stops paying along one curve, in words."""
    stop, rows = curves["stops_paying"][name], curves[name]
    what = name.replace("_", " ")
    if stop is None:
        return f"speculation still pays at {what} {rows[-1][name]}, the largest measured"
    if stop == rows[0][name]:
        return f"speculation does not pay at any {what} measured (speedup < 1 from {stop} on): switch it off"
    return f"speculation stops paying at {what} {stop} (speedup < 1 from there on)"


def plot_curves(report: dict[str, Any], out: Path) -> None:
    """A PNG of the speedup against concurrency and against prompt length, with the break-even line."""
    plt = pyplot()
    curves = report["curves"]
    names = [n for n in CURVE_TITLES if n in curves]
    fig, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 3.4), dpi=120, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        xs = [row[name] for row in curves[name]]
        ax.plot(xs, [row["speedup"] for row in curves[name]], marker="o", color="#4C72B0")
        ax.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(CURVE_TITLES[name])
        ax.set_ylabel("speedup (with drafter / plain)")
        ax.set_title(verdict(curves, name).split(" (")[0].split(":")[0], fontsize=9)
    fig.suptitle(f"{report['kind']} drafter in {report['engine']['package']} {report['engine']['version']}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
