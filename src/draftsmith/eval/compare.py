"""Rank drafters measured on the same prompts: the paired difference in tau, its standard error and a verdict.

    draftsmith compare REFERENCE.json OTHER.json [MORE.json ...] [--margin 0.05] [--line 1.10] [--json OUT]

Each report after the first is compared with the first. Two drafters decoding the same prompts meet the same
easy and hard answers, so the prompt-to-prompt spread that dominates each tau's own standard error cancels in
their difference: the paired standard error of tau(B) - tau(A) is far smaller than the two errors combined,
and a set of prompts too small to rank two unpaired figures 5 % apart can rank them paired.

tau is pooled (tokens over verification steps), as vLLM and SGLang print it. Its difference is linearised per
prompt (delta method, each prompt one cluster of its turns' steps, as the report's `tau_stderr`):
    u_j = (C_j - tau N_j) / sum N        (C_j tokens over N_j steps of prompt j)
    se(tau_B - tau_A) = sqrt(k / (k - 1) * sum_j (u_j^B - u_j^A)^2)      over k prompts.
The verdict is "ahead" or "behind" when the difference is at least --sigmas (2) standard errors, else "not
separated". "prompts for 5 %" is how many prompts of the same spread it would take for a difference of
--margin (a fraction of the reference's tau) to be --sigmas paired standard errors.

A goal stated as a ratio ("at least 1.10x the reference's tau") is tested with --line 1.10: the margin
tau(B) - 1.10 tau(A), linearised per prompt as u_j^B - 1.10 u_j^A, its paired standard error, and whether B is
"above" or "below" the line by --sigmas standard errors (else "not separated"), with how many prompts of the
same spread would separate it. A ratio alone cannot say this: 1.12x on 30 prompts may not be 2 standard
errors above 1.10x.

The reports must have measured the same prompts with the same data, target and decoding settings (their tree
and depth may differ); anything else is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftsmith.models.claims import alike_difference
from draftsmith.runtime.display import fmt_value, table
from draftsmith.runtime.errors import UserError, run_main

from .gate import read_report


@dataclass(frozen=True)
class Paired:
    """`other` against `reference` on the same prompts."""

    reference: str
    other: str
    tau_reference: float
    tau_other: float
    difference: float  # tau_other - tau_reference
    stderr: float  # paired standard error of the difference
    ratio: float  # tau_other / tau_reference
    prompts: int
    answers: int
    verdict: str  # "ahead", "behind" or "not separated" (other against reference)
    prompts_for_margin: int  # prompts for a `margin` difference to be `sigmas` paired standard errors
    margin: float
    sigmas: float
    line: float = 1.0  # the ratio the margin below is taken against (--line)
    over_line: float = 0.0  # tau_other - line * tau_reference
    over_line_stderr: float = 0.0  # its paired standard error
    line_verdict: str = "not separated"  # "above", "below" or "not separated"
    prompts_for_line: int = 0  # prompts of the same spread for `over_line` to be `sigmas` standard errors


def prompt_clusters(report: dict[str, Any], where: str) -> dict[str, tuple[float, int]]:
    """Per prompt id: (tokens committed by verification steps, verification steps), summed over its turns,
    from the report's `per_prompt` rows (a row's steps are its target forwards less the prefill)."""
    rows = report.get("per_prompt")
    if not rows:
        raise UserError(f"{where} has no per-prompt rows; measure it with `draftsmith eval --report`")
    clusters: dict[str, tuple[float, int]] = {}
    seen: set[tuple[str, int]] = set()
    for number, row in enumerate(rows):
        try:
            key = (str(row["id"]), int(row["turn"]))
            steps = int(row["target_forwards"]) - 1
            tokens = float(row["tau"]) * steps if steps > 0 else 0.0
        except (KeyError, TypeError, ValueError):
            raise UserError(
                f"{where}: per_prompt row {number} is not a measured answer ({row!r:.80})"
            ) from None
        if key in seen or not math.isfinite(tokens) or steps < 0:
            raise UserError(
                f"{where}: per_prompt row {number} ({key[0]!r} turn {key[1]}) is repeated or not a count"
            )
        seen.add(key)
        c, n = clusters.get(key[0], (0.0, 0))
        clusters[key[0]] = (c + tokens, n + steps)
    return clusters


def _answers(report: dict[str, Any]) -> set[tuple[str, int]]:
    return {(str(r["id"]), int(r["turn"])) for r in report["per_prompt"]}


def _linearised(clusters: dict[str, tuple[float, int]], ids: Sequence[str]) -> tuple[float, list[float]]:
    steps = sum(clusters[i][1] for i in ids)
    if steps == 0:
        raise UserError("no verification step ran on these prompts; there is no tau to compare")
    tau = sum(clusters[i][0] for i in ids) / steps
    return tau, [(clusters[i][0] - tau * clusters[i][1]) / steps for i in ids]


def pair(
    reference: dict[str, Any],
    other: dict[str, Any],
    names: tuple[str, str] = ("reference", "other"),
    margin: float = 0.05,
    sigmas: float = 2.0,
    line: float = 1.0,
) -> Paired:
    """The paired comparison of two reports measured alike on the same prompts (refused otherwise)."""
    differ = alike_difference(reference, other, ignore=("tree", "depth"))
    if differ:
        raise UserError(
            f"{names[0]} and {names[1]} were not measured alike ({differ}); a paired comparison needs "
            "the same prompts, data, target and decoding settings"
        )
    a, b = prompt_clusters(reference, names[0]), prompt_clusters(other, names[1])
    only = sorted(_answers(reference) ^ _answers(other))
    if only:
        raise UserError(
            f"{names[0]} and {names[1]} did not answer the same prompts ({len(only)} answers in one only, e.g. "
            f"{only[0][0]!r} turn {only[0][1]}); measure both on the same data and --num-prompts"
        )
    ids = sorted(a)
    k = len(ids)
    if k < 2:
        raise UserError(f"a paired standard error needs at least 2 prompts; the reports measured {k}")
    tau_a, u_a = _linearised(a, ids)
    tau_b, u_b = _linearised(b, ids)
    stderr, over_stderr = (
        math.sqrt(k / (k - 1) * sum((y - r * x) ** 2 for x, y in zip(u_a, u_b, strict=True)))
        for r in (1.0, line)
    )
    difference, over = tau_b - tau_a, tau_b - line * tau_a
    return Paired(
        reference=names[0],
        other=names[1],
        tau_reference=tau_a,
        tau_other=tau_b,
        difference=difference,
        stderr=stderr,
        ratio=tau_b / tau_a,
        prompts=k,
        answers=len(reference["per_prompt"]),
        verdict=_verdict(difference, stderr, sigmas, ("ahead", "behind")),
        prompts_for_margin=_prompts_for(margin * tau_a, stderr, k, sigmas),
        margin=margin,
        sigmas=sigmas,
        line=line,
        over_line=over,
        over_line_stderr=over_stderr,
        line_verdict=_verdict(over, over_stderr, sigmas, ("above", "below")),
        prompts_for_line=_prompts_for(abs(over), over_stderr, k, sigmas),
    )


def _verdict(difference: float, stderr: float, sigmas: float, words: tuple[str, str]) -> str:
    if abs(difference) >= sigmas * stderr and difference != 0:
        return words[0] if difference > 0 else words[1]
    return "not separated"


def _prompts_for(difference: float, stderr: float, k: int, sigmas: float) -> int:
    """Prompts of the same spread for `difference` to be `sigmas` paired standard errors (the error shrinks as
    one over the root of the prompts); 0 when there is no difference to separate."""
    if difference <= 0:
        return 0
    return max(2, math.ceil(k * (sigmas * stderr / difference) ** 2))


def markdown(results: Sequence[Paired]) -> list[str]:
    """A table: each drafter against the reference, with the paired figures and the verdict."""
    margin, sigmas = results[0].margin, results[0].sigmas
    header = [
        "drafter",
        "tau",
        f"against {results[0].reference}",
        "ratio",
        f"verdict ({sigmas:g} s.e.)",
        f"prompts for {margin:.0%} at {sigmas:g} s.e.",
    ]
    rows: list[tuple[str, ...]] = [
        (results[0].reference, fmt_value(results[0].tau_reference), "-", "-", "reference", "-")
    ]
    rows += [
        (
            r.other,
            fmt_value(r.tau_other),
            f"{r.difference:+.3f} ± {r.stderr:.3f}",
            f"{r.ratio:.3f}x",
            r.verdict,
            f"{r.prompts_for_margin:,} (have {r.prompts})",
        )
        for r in results
    ]
    line = results[0].line
    if line != 1.0:
        header += [f"against {line:g}x the reference", f"verdict at {line:g}x", "prompts to separate"]
        rows[0] += ("-", "-", "-")
        rows[1:] = [
            (
                *row,
                f"{r.over_line:+.3f} ± {r.over_line_stderr:.3f}",
                r.line_verdict,
                f"{r.prompts_for_line:,} (have {r.prompts})" if r.prompts_for_line else "-",
            )
            for row, r in zip(rows[1:], results, strict=True)
        ]
    return table(header, rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("reports", type=Path, nargs="+", help="eval reports; the first is the reference")
    p.add_argument(
        "--margin", type=float, default=0.05, help="the relative difference to size the set for (0.05)"
    )
    p.add_argument("--sigmas", type=float, default=2.0, help="standard errors that separate two drafters (2)")
    p.add_argument(
        "--line",
        type=float,
        default=1.0,
        help="also test each drafter against this multiple of the reference's tau, e.g. 1.10 for a 1.10x goal",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the comparisons here as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.reports) < 2:
        raise UserError("compare needs a reference report and at least one other")
    if not (0 < args.margin < 1 and math.isfinite(args.sigmas) and args.sigmas > 0):
        raise UserError(
            f"--margin must be in (0, 1) and --sigmas above 0, got {args.margin} and {args.sigmas}"
        )
    if not (math.isfinite(args.line) and args.line > 0):
        raise UserError(f"--line must be a ratio above 0 such as 1.10, got {args.line}")
    reports = [(str(p), read_report(p)) for p in args.reports]  # one line for what is not a report
    (ref_name, ref), others = reports[0], reports[1:]
    results = [pair(ref, rep, (ref_name, name), args.margin, args.sigmas, args.line) for name, rep in others]
    print("\n".join(markdown(results)))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
