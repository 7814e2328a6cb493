"""How many tokens vLLM drafts per step in an export (`num_speculative_tokens`): --num-speculative-tokens, else
the depth a report recommends, else the layout's default. A report is the evaluator's (its `recommended_depth`:
ALGORITHMS.md 9.8) or `engine-eval --depths`'s (the depth measured fastest in vLLM itself, `depth_check`).
The choice is set in the export's speculative config, its serve commands and a speculators config, and recorded
in draftsmith_export.json (`speculative_depth`) with the reason `draftsmith export` prints. Over several data
sets' `engine-eval --depths` reports, `combined_depths` makes the one report the depth is read from."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.models.claims import check_engine_of_checkpoint, check_of_checkpoint

from .layouts.common import Export, ExportError
from .reports import data_label, read_reports, report_files


def serves_depth(export: Export, depth: int) -> bool:
    """Whether vLLM serves `export` with `num_speculative_tokens` = `depth`."""
    low, high = export.served_depths
    return depth >= low and (high is None or depth <= high)


def served_depths_text(export: Export) -> str:
    """The depths `export` is served with, in words ("1..3", "3 only", "1 or more")."""
    low, high = export.served_depths
    if high is None:
        return f"{low} or more"
    return f"{low} only" if low == high else f"{low}..{high}"


def set_speculative_depth(export: Export, depth: int) -> None:
    """Draft `depth` tokens per step in vLLM: the speculative config, the serve commands that show it, and a
    speculators config's proposal methods (what `vllm serve {dir}` reads).

    Raises:
        ExportError: the layout has no vLLM speculative config, or vLLM does not serve it at `depth`.
    """
    if export.speculative is None:
        raise ExportError(f"{export.layout} has no vLLM speculative config to set num_speculative_tokens in")
    if not serves_depth(export, depth):
        raise ExportError(
            f"num_speculative_tokens {depth}: {export.layout} is served with {served_depths_text(export)} "
            "(what was trained)"
        )
    old = json.dumps(export.speculative)
    export.speculative = {**export.speculative, "num_speculative_tokens": depth}
    export.serve = [cmd.replace(old, json.dumps(export.speculative)) for cmd in export.serve]
    methods = export.config.get("speculators_config", {}).get("proposal_methods", [])
    for method in methods:
        if "speculative_tokens" in method:
            method["speculative_tokens"] = depth


def measured_report(source: dict[str, Any], report: str | Path | None) -> tuple[Path, dict[str, Any]] | None:
    """`(path, report)` of the report export reads the depth from: `report`, else the checkpoint's eval.json
    (the lookup `push` cites on the card); None when there is none. It is checked to be a measurement of this
    checkpoint's drafter, weights and target (models/claims.py): an evaluator report, or vLLM's own
    (`engine-eval`)."""
    files = report_files(source["dir"], [Path(report)] if report is not None else None)
    if not files:
        return None
    loaded = read_reports(files[:1], "--report" if report is not None else "")[0]
    where = f"{'--report ' if report is not None else ''}{files[0]}"
    if "depth_check" in loaded or "engine" in loaded:
        check_engine_of_checkpoint(loaded, where, source["dir"], source["kind"], source["target"])
    else:
        check_of_checkpoint(loaded, where, source["dir"], source["target"])
    return files[0], loaded


def check_depth_option(override: int | None) -> None:
    """Refuse a --num-speculative-tokens below 1 (before anything is loaded)."""
    if override is not None and override < 1:
        raise ExportError(f"--num-speculative-tokens must be >= 1, got {override}")


def choose_depth(
    built: Export, source: dict[str, Any], report: str | Path | None, override: int | None
) -> dict[str, Any] | None:
    """How many tokens vLLM drafts per step, set in `built` and returned as the record draftsmith_export.json
    keeps (`num_speculative_tokens`, `chosen_by`, the report and its recommendation, the summary's `message` and
    `warning`): --num-speculative-tokens, else the report's recommended depth, else the layout's default.
    None for a layout without a vLLM speculative config (--num-speculative-tokens is then refused)."""
    check_depth_option(override)
    if built.speculative is None:
        if override is not None:
            raise ExportError(
                f"--num-speculative-tokens sets vLLM's speculative config; {built.layout} has none (use --to vllm)"
            )
        return None
    found = measured_report(source, report)
    path, measured = (str(found[0]), recommendation(found[1])) if found else (None, {})
    depth, chosen_by, message = _depth_and_reason(built, path, measured, override)
    if chosen_by != "default":  # the layout's default stays exactly as the layout wrote it
        set_speculative_depth(built, depth)
    return {
        "num_speculative_tokens": depth,
        "chosen_by": chosen_by,
        "report": path,
        "recommended_depth": measured.get("recommended_depth"),
        "recommended_speedup": measured.get("recommended_speedup"),
        "message": message,
        "warning": _off_warning(measured, path) if measured.get("recommended_depth") == 0 else None,
    }


def recommendation(report: dict[str, Any]) -> dict[str, Any]:
    """The report with the depth keys export reads (`recommended_depth`, `recommended_speedup`,
    `expected_speedup_by_depth`, `recommended_by`): an `engine-eval --depths` report's are vLLM's measured
    speedups, the fastest depth recommended (0 when none beat plain decoding); an evaluator report's are its
    own."""
    check = report.get("depth_check") or {}
    speedups = measured_speedups(report)
    fastest = check.get("fastest_measured_depth")
    if fastest not in speedups:
        return {**report, "recommended_by": "recommends"}
    paid = speedups[fastest] > 1.0
    return {
        **report,
        "recommended_depth": fastest if paid else 0,
        "recommended_speedup": speedups[fastest] if paid else 1.0,
        "expected_speedup_by_depth": [speedups.get(k, 0.0) for k in range(1, max(speedups) + 1)],
        "recommended_by": "measured fastest in vLLM",
        "depth_costs": "vLLM (measured)",
    }


def _depth_and_reason(
    built: Export, path: str | None, measured: dict[str, Any], override: int | None
) -> tuple[int, str, str]:
    """`(depth, chosen_by, message)`: the option ("option"), else a recommendation the layout can serve
    ("report"), else the layout's default ("default"), with the reason in words."""
    default = int((built.speculative or {})["num_speculative_tokens"])
    recommended, speedup = measured.get("recommended_depth"), measured.get("recommended_speedup")
    if override is not None:
        return override, "option", f"num_speculative_tokens {override}: set by --num-speculative-tokens"
    if recommended is not None and recommended >= 1 and serves_depth(built, recommended):
        expected = f" (expected {speedup:.2f}x plain decoding)" if isinstance(speedup, (int, float)) else ""
        return (
            recommended,
            "report",
            f"num_speculative_tokens {recommended}: the depth {path} {measured['recommended_by']}{expected}",
        )
    if path is None:
        why = (
            "no evaluator report was found (pass --report REPORT.json, or save one in the checkpoint with "
            "`draftsmith eval ... --save-eval`)"
        )
    elif recommended is None:
        why = f"{path} recommends no depth (a tree run, or a report from before the recommendation)"
    elif recommended == 0:
        why = f"{path} recommends none (speculation off)"
    else:
        why = (
            f"{path} recommends {recommended}, but {built.layout} is served with {served_depths_text(built)}"
        )
    return default, "default", f"num_speculative_tokens {default}: the layout's default; {why}"


def _off_warning(measured: dict[str, Any], path: str | None) -> str:
    """The warning for a report whose measured costs say that no draft depth beats plain decoding."""
    speedups = measured.get("expected_speedup_by_depth") or []
    best = max(range(len(speedups)), key=lambda i: speedups[i], default=None)
    shown = f" (best depth {best + 1}: {speedups[best]:.2f}x)" if best is not None else ""
    device = (measured.get("settings") or {}).get("versions", {}).get("device_name")
    where = f" on {device}" if device else ""
    return (
        f"the measured costs in {path}{where} say speculation does not pay: no draft depth beats plain "
        f"decoding{shown}; the drafter is exported anyway"
    )


def measured_speedups(report: dict[str, Any]) -> dict[int, float]:
    """Depth -> the speedup vLLM measured there, from an `engine-eval --depths` report (empty without one); a
    depth whose run measured no speedup is left out."""
    rows = (report.get("depth_check") or {}).get("rows", [])
    return {r["depth"]: r["speedup_measured"] for r in rows if r.get("speedup_measured")}


def combined_depths(engines: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Over several `engine-eval --depths` reports (one per data set), the report the vLLM export takes its
    depth from: the speedup per depth is the geometric mean of the sets' measured speedups, at the depths every
    set measured (one set's fastest depth may be another's slowest). None for fewer than two such reports."""
    measured = [e for e in engines if "depth_check" in e]
    if len(measured) < 2:
        return None
    speedups = [measured_speedups(e) for e in measured]
    shared = sorted(set.intersection(*(set(s) for s in speedups)))
    if not shared:
        raise ValueError(
            "--engine-report: the reports' --depths have no depth in common, so no depth can be compared across "
            f"them ({', '.join(str(sorted(s)) for s in speedups)}); measure every set at the same --depths"
        )
    rows = [
        {"depth": k, "speedup_measured": math.prod(s[k] for s in speedups) ** (1 / len(speedups))}
        for k in shared
    ]
    return {
        "kind": measured[0].get("kind"),
        "engine": measured[0].get("engine"),
        "measured": measured[0].get("measured"),  # one drafter, each report checked against it (push)
        "settings": measured[0].get("settings", {}),
        "sets": [data_label(e["settings"]["data"]) for e in measured],
        "depth_check": {
            "fastest_measured_depth": max(rows, key=lambda r: r["speedup_measured"])["depth"],
            "rows": rows,
            "combined": "geometric mean of the measured speedups over the sets",
        },
    }
