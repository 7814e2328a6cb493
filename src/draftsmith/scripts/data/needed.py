"""`draftsmith data needed`: how many training tokens a drafter needs to reach a tau, from its own curve.

    draftsmith data needed --point 64k=eval-64k.json --point 256k=eval-256k.json --point 1m=eval-1m.json \\
        --tau 2.0

Each --point is a drafter trained on that many tokens (k, m or a plain count; `data.max_samples` prefixes of
one shuffled `draftsmith data mix` make a short sweep) with the `draftsmith eval --report` it measured on held-out
prompts (the same prompts and settings for every point). The line tau = a + b ln(tokens) is fitted (weighted by
each tau's standard error) and inverted for --tau; the range is a bootstrap over the points' standard errors
(eval/scaling.py). With four or more points it also predicts the largest from the others, so the fit's error is
measured, not assumed. The line cannot saturate: far beyond the measured sizes it is an optimistic estimate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from draftsmith.eval.scaling import Point, extrapolation, fit, predict, tokens_for
from draftsmith.runtime.errors import UserError, run_main

SCALE = {"k": 1_000, "m": 1_000_000}


def parse_tokens(text: str) -> float:
    """'64k' -> 64,000; '2.5m' -> 2,500,000; '90000' -> 90,000."""
    text = text.strip().lower().replace(",", "")
    try:
        value = float(text[:-1]) * SCALE[text[-1]] if text[-1:] in SCALE else float(text)
    except ValueError:
        raise UserError(f"--point: {text!r} is not a token count (e.g. 64k, 2.5m or 90000)") from None
    if value <= 0:
        raise UserError(f"--point: {text!r} tokens must be positive")
    return value


def read_point(spec: str) -> Point:
    tokens, sep, path = spec.partition("=")
    if not sep:
        raise UserError(f"--point {spec!r}: expected TOKENS=REPORT.json, e.g. 64k=runs/eval-64k.json")
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"--point {spec}: cannot read the report ({err})") from None
    tau = report.get("tau") if isinstance(report, dict) else None
    if not isinstance(tau, (int, float)):
        raise UserError(f"--point {spec}: {path} is not a `draftsmith eval` report (no tau)")
    return Point(parse_tokens(tokens), float(tau), float(report.get("tau_stderr") or 0.0))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="draftsmith data needed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--point", action="append", default=[], metavar="TOKENS=REPORT", help="repeat, >= 3")
    p.add_argument("--tau", type=float, required=True, help="the acceptance length to reach")
    args = p.parse_args(argv)
    points = sorted((read_point(s) for s in args.point), key=lambda q: q.tokens)
    if len({q.tokens for q in points}) < 3:
        p.error("give at least three --point of different sizes (two fix a line but not its uncertainty)")
    line = fit(points)
    for q in points:
        print(
            f"  {q.tokens:>14,.0f} tokens: tau {q.tau:.3f} ± {q.stderr:.3f} (line: {line.tau(q.tokens):.3f})"
        )
    print(
        f"fit: tau = {line.a:.3f} + {line.b:.4f} ln(tokens): +{line.b * 0.6931:.3f} per doubling of the data"
    )
    if len(points) >= 4:
        last = points[-1]
        guess = predict(points[:-1], last.tokens)
        print(
            f"check: the smaller points predict {guess.value:.3f} (80% range {guess.low:.3f}-{guess.high:.3f}) "
            f"at {last.tokens:,.0f} tokens; measured {last.tau:.3f} ± {last.stderr:.3f}"
        )
    need = tokens_for(points, args.tau)
    if need.value is None:
        print(f"tau {args.tau:g}: not reachable with more of this data (the fitted line does not rise)")
        return 0
    low = "-" if need.low is None else f"{need.low:,.0f}"
    high = "-" if need.high is None else f"{need.high:,.0f}"
    print(
        f"tau {args.tau:g} needs about {need.value:,.0f} training tokens (80% range {low} to {high}; "
        f"{extrapolation(points, need.value):.1f}x the largest point; {need.no_answer:.0%} of the bootstrap lines "
        "did not rise)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
