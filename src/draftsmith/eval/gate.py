"""The deployment gate: pass or fail a drafter on its evaluation report, before it ships.

    draftsmith gate --report NEW.json [--baseline OLD.json] [--min-tau X] [--max-drop 0.05]

Reads reports written by `draftsmith eval --report` (or a checkpoint's `eval.json` from `--save-eval`).
Fails (exit status 3, one line saying why) when:
  - the report's T=0 lossless check failed (the drafter changed the target's output: never ship that);
  - tau < --min-tau;
  - with --baseline: tau fell by more than --max-drop (a fraction of the baseline's tau). The two reports must
    have been measured alike (the same target by its identity, the same data by its content, the same prompts,
    temperature, tree and depth), or the comparison is refused (exit status 2), since a different setting
    changes tau by itself.
A report that is not a measurement (no tau, a tau that is not a finite number of at least 1) and a --min-tau or
--max-drop that is not a finite number are refused in one line (exit status 2).
Passes (exit status 0) with one line of figures otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.models.claims import ClaimError, alike_difference, check_values
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
    try:
        return check_values(report, str(path))
    except ClaimError as err:
        raise GateUsageError(str(err)) from None


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
        detail = ", ".join(
            f"{k}: {baseline['settings'].get(k)!r} -> {report['settings'].get(k)!r}" for k in differ
        ) or alike_difference(baseline, report)
        if detail:
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


def check_min_tau(min_tau: float | None) -> None:
    """Refuse a --min-tau no tau can be compared with (NaN passes every comparison), before anything loads."""
    if min_tau is not None and not (math.isfinite(min_tau) and min_tau >= 1):
        raise GateUsageError(
            f"--min-tau must be a finite tau of at least 1 (1 = plain decoding), got {min_tau}"
        )


def usage(message: str) -> int:
    """A report or option that cannot be gated: one `error:` line, exit status 2."""
    print(f"error: draftsmith gate: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.min_tau is None and args.baseline is None:
        return usage("pass --min-tau X, --baseline OLD.json, or both")
    if not 0 <= args.max_drop < 1:
        return usage(f"--max-drop is a fraction in [0, 1), got {args.max_drop}")
    try:
        check_min_tau(args.min_tau)
        baseline = read_report(args.baseline) if args.baseline else None
        passed, reason = gate(read_report(args.report), baseline, args.min_tau, args.max_drop)
    except GateUsageError as err:
        return usage(str(err))
    print(f"gate {'PASSED' if passed else 'FAILED'}: {reason}")
    return 0 if passed else FAIL


if __name__ == "__main__":
    sys.exit(run_main(main))
