"""`draftsmith data needed`: how many training tokens a drafter needs to reach a tau, from its own curve.

    draftsmith data needed --point 64k=eval-64k.json --point 256k=eval-256k.json --point 1m=eval-1m.json \\
        --tau 2.0

Each --point is a drafter trained on that many tokens (k, m or a plain count; `data.max_samples` prefixes of
one shuffled `draftsmith data mix` make a short sweep) with the `draftsmith eval --report` it measured on held-out
prompts (the same prompts and settings for every point). The line tau = a + b ln(tokens) is fitted (weighted by
each tau's standard error) and inverted for --tau; the range is a bootstrap over the points' standard errors
(eval/scaling.py). With four or more points it also predicts the largest from the others, so the fit's error is
measured, not assumed. The line cannot saturate: far beyond the measured sizes it is an optimistic estimate, and an
answer more than 10x the largest point says so beside the number.

Refused in one line, before any fit: a --tau that is not a finite number above 1, or that the measured depth
cannot reach (a step commits at most depth + 1 tokens); a point whose report is not a measurement (no finite tau
of at least 1) or measured a baseline (ngram); the same report twice or two points of one size; and points not
measured alike (another data set or content, prompt count, token budget, decoding settings or target).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.eval.scaling import Point, extrapolation, fit, predict, tokens_for
from draftsmith.models.claims import ClaimError, check_alike, check_values, drafter_label, is_baseline
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


def read_point(spec: str) -> tuple[Point, dict[str, Any], str]:
    """`(point, report, path)` of one --point: a token count and an evaluator report of a trained drafter."""
    tokens, sep, path = spec.partition("=")
    if not sep:
        raise UserError(f"--point {spec!r}: expected TOKENS=REPORT.json, e.g. 64k=runs/eval-64k.json")
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"--point {spec}: cannot read the report ({err})") from None
    try:
        check_values(report, f"--point {spec}")
    except ClaimError as err:
        raise UserError(str(err)) from None
    if report["tau"] is None:
        raise UserError(f"--point {spec}: the report has no tau (no verification step ran)")
    if is_baseline(report):
        raise UserError(
            f"--point {spec}: {path} measures {drafter_label(report)}, which was trained on no tokens"
        )
    return (
        Point(parse_tokens(tokens), float(report["tau"]), float(report.get("tau_stderr") or 0.0)),
        report,
        path,
    )


def check_goal(tau: float) -> None:
    """A goal tau is a finite number of tokens per step above 1 (plain decoding commits 1)."""
    if not (math.isfinite(tau) and tau > 1):
        raise UserError(
            f"--tau must be a finite number above 1 (tokens per verification step; 1 = plain), got {tau}"
        )


def read_curve(specs: Sequence[str], goal: float) -> list[Point]:
    """The points of one curve, smallest first: distinct reports and sizes, measured alike (the same data and
    its content, prompts, decoding settings and target), of a depth that can reach `goal`."""
    read = [read_point(s) for s in specs]
    paths = [Path(path).resolve() for _, _, path in read]
    if len(set(paths)) < len(paths):
        raise UserError(
            "--point: the same report is given twice; each point is a drafter trained on its own size"
        )
    sizes = [q.tokens for q, _, _ in read]
    if len(set(sizes)) < len(sizes):
        raise UserError("--point: two points have the same token count; each point is one training size")
    try:
        check_alike(
            [(f"--point {s}", r) for s, (_, r, _) in zip(specs, read, strict=True)],
            "a curve's points "
            "must be measured on the same prompts and settings (only the training tokens differ)",
        )
    except ClaimError as err:
        raise UserError(str(err)) from None
    depth = (read[0][1].get("settings") or {}).get("depth") if read else None
    if isinstance(depth, int) and goal >= depth + 1:
        raise UserError(
            f"--tau {goal:g} cannot be reached at the measured depth {depth}: a step commits at most {depth + 1} "
            "tokens; measure the points at a larger --depth"
        )
    return sorted((q for q, _, _ in read), key=lambda q: q.tokens)


FAR = 10.0  # past this many times the largest point, the answer is flagged as far beyond the data


def answer_line(points: Sequence[Point], goal: float, need: Any) -> str:
    """The answer with its range and, far beyond the data, the caveat beside the number."""
    if need.value is None or not math.isfinite(need.value):
        return (
            f"tau {goal:g}: beyond any data size this curve can support (the fitted line reaches it only past "
            f"{'the largest number a float holds' if need.value else 'never'}); more of this data will not get there"
        )
    low = "-" if need.low is None else f"{need.low:,.0f}"
    high = "-" if need.high is None or not math.isfinite(need.high) else f"{need.high:,.0f}"
    far = extrapolation(points, need.value)
    caveat = (
        f" (far beyond the data: {far:,.0f}x the largest measured point; the line cannot saturate, so the true need "
        "is likely larger)"
        if far > FAR
        else ""
    )
    factor = "" if caveat else f"{far:.1f}x the largest point; "
    return (
        f"tau {goal:g} needs about {need.value:,.0f} training tokens{caveat} (80% range {low} to {high}; "
        f"{factor}{need.no_answer:.0%} of the bootstrap lines did not rise)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="draftsmith data needed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--point", action="append", default=[], metavar="TOKENS=REPORT", help="repeat, >= 3")
    p.add_argument("--tau", type=float, required=True, help="the acceptance length to reach (above 1)")
    args = p.parse_args(argv)
    check_goal(args.tau)
    points = read_curve(args.point, args.tau)
    if len(points) < 3:
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
    print(answer_line(points, args.tau, need))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
