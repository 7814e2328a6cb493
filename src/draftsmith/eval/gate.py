"""The deployment gate: pass or fail a drafter on its evaluation report, before it ships.

    draftsmith gate --report NEW.json [--baseline OLD.json] [--min-tau X] [--max-drop 0.05]

Reads reports written by `draftsmith eval --report` (or a checkpoint's `eval.json` from `--save-eval`).
Fails (exit status 3, one line saying why) when:
  - the report's T=0 lossless check failed (the drafter changed the target's output: never ship that);
  - tau < --min-tau;
  - with --baseline: tau fell by more than --max-drop (a fraction of the baseline's tau). The two reports must
    have been measured alike (same target, data, prompts, temperature, tree, depth), or the comparison is
    refused (exit status 2), since a different setting changes tau by itself.
Passes (exit status 0) with one line of figures otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.runtime.errors import run_main

FAIL = 3
# Settings that must agree for two tau figures to be comparable.
COMPARABLE = (
    "target",
    "data",
    "num_prompts",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "tree",
    "depth",
)


class GateUsageError(ValueError):
    """Reports that cannot be gated (unreadable, or not measured alike)."""


def read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise GateUsageError(f"cannot read report {path}: {err}") from None
    if not isinstance(report, dict) or "tau" not in report or "settings" not in report:
        raise GateUsageError(
            f"{path} is not a draftsmith eval report (no tau / settings); write one with --report"
        )
    return report


def gate(
    report: dict[str, Any], baseline: dict[str, Any] | None, min_tau: float | None, max_drop: float
) -> tuple[bool, str]:
    """`(passed, one-line reason)`."""
    tau = report["tau"]
    if tau is None:
        return False, "the report has no tau (no verification step ran)"
    if report.get("lossless") is False:
        return False, "the T=0 lossless check failed: speculative output differed from plain greedy decoding"
    if min_tau is not None and tau < min_tau:
        return False, f"tau {tau:.3f} is below --min-tau {min_tau:.3f}"
    line = f"tau {tau:.3f}"
    if baseline is not None:
        differ = [k for k in COMPARABLE if report["settings"].get(k) != baseline["settings"].get(k)]
        if differ:
            detail = ", ".join(
                f"{k}: {baseline['settings'].get(k)!r} -> {report['settings'].get(k)!r}" for k in differ
            )
            raise GateUsageError(
                f"the reports were not measured alike ({detail}); re-run both with the same settings"
            )
        base = baseline["tau"]
        if base:
            drop = (base - tau) / base
            if drop > max_drop:
                return (
                    False,
                    f"tau {tau:.3f} fell {100 * drop:.1f}% from the baseline's {base:.3f} (--max-drop {max_drop:.0%})",
                )
            line += f", {100 * -drop:+.1f}% against the baseline's {base:.3f}"
    if min_tau is not None:
        line += f", at least --min-tau {min_tau:.3f}"
    return True, line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith gate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--report", type=Path, required=True, help="the candidate's eval report (JSON)")
    p.add_argument(
        "--baseline", type=Path, default=None, help="the deployed drafter's report, measured alike"
    )
    p.add_argument("--min-tau", type=float, default=None, help="fail below this tau")
    p.add_argument(
        "--max-drop", type=float, default=0.05, help="fail when tau falls by more than this fraction"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.min_tau is None and args.baseline is None:
        print("draftsmith gate: pass --min-tau X, --baseline OLD.json, or both", file=sys.stderr)
        return 2
    if not 0 <= args.max_drop < 1:
        print(f"draftsmith gate: --max-drop is a fraction in [0, 1), got {args.max_drop}", file=sys.stderr)
        return 2
    try:
        baseline = read_report(args.baseline) if args.baseline else None
        passed, reason = gate(read_report(args.report), baseline, args.min_tau, args.max_drop)
    except GateUsageError as err:
        print(f"draftsmith gate: {err}", file=sys.stderr)
        return 2
    print(f"gate {'PASSED' if passed else 'FAILED'}: {reason}")
    return 0 if passed else FAIL


if __name__ == "__main__":
    sys.exit(run_main(main))
