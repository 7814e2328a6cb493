"""Where prompt lookup's lead comes from: the answers split by how much of them prompt lookup could copy.

    python -m bench.repeat_split NGRAM.json DRAFTER.json [--threshold 2.0]

Both reports are `draftsmith eval` runs over the same prompts (the same answers: every run is lossless). An
answer is "repeating" when prompt lookup's own tau on it is at least --threshold: its tokens largely continue
text seen earlier (the prompt, or the answer looping on itself), which an n-gram copy finds and a drafter must
learn to copy. For each part, both drafters' pooled tau (tokens over verification steps, as the evaluator
pools it) and the share of all answer tokens in that part. A drafter that trails prompt lookup overall but
leads it on the other answers is limited by copying, not by predicting the target's next tokens. With the
plain answers and the drafter's directory, also each part's share of tokens outside the draft vocabulary
(which no draft can propose).

    python -m bench.repeat_split NGRAM.json DRAFTER.json --plain SET-plain.json --draft-vocab DRAFTER/final

Feeds docs/BENCHMARKS.md, "The chat drafter: 956k answer tokens made on this CPU".
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.display import table as md_table


@dataclass(frozen=True)
class Part:
    """One part of the answers: how many, their tokens, and each drafter's verification steps over them."""

    answers: int
    tokens: int
    steps_ngram: int
    steps_drafter: int

    @property
    def tau_ngram(self) -> float:
        return self.tokens / self.steps_ngram if self.steps_ngram else float("nan")

    @property
    def tau_drafter(self) -> float:
        return self.tokens / self.steps_drafter if self.steps_drafter else float("nan")


def _part(row: dict, threshold: float) -> str:
    """The part of one answer (a report's `per_prompt` row of prompt lookup)."""
    return "repeating" if row["tau"] >= threshold else "other"


def _answers(report: dict) -> dict[tuple[str, int], dict]:
    return {(str(p["id"]), int(p["turn"])): p for p in report["per_prompt"]}


def split(ngram: dict, drafter: dict, threshold: float) -> dict[str, Part]:
    """The answers of both reports in two parts by prompt lookup's per-answer tau (`repeating`: at least
    `threshold`; `other`: below).

    Raises:
        ValueError: the reports decoded other answers (other prompts, or another count of new tokens).
    """
    a, b = _answers(ngram), _answers(drafter)
    if a.keys() != b.keys():
        raise ValueError(
            "the two reports measured different prompts: run both on the same --data and prompts"
        )
    parts: dict[str, list[tuple[int, int, int]]] = {"repeating": [], "other": []}
    for key, pa in a.items():
        pb = b[key]
        if pa["new_tokens"] != pb["new_tokens"]:
            raise ValueError(
                f"answer {key}: {pa['new_tokens']} new tokens in one report, {pb['new_tokens']} in the other"
            )
        parts[_part(pa, threshold)].append((pa["new_tokens"], pa["target_forwards"], pb["target_forwards"]))
    return {
        name: Part(len(rows), sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] for r in rows))
        for name, rows in parts.items()
    }


def outside_vocab(
    ngram: dict, answers: list[list[int]], in_vocab: list[bool], threshold: float
) -> dict[str, float]:
    """The share of each part's answer tokens outside the drafter's vocabulary (`in_vocab[token]`), which no
    draft can propose: `answers` are the plain answers in the report's order (bench.scaling's `SET-plain.json`).

    Raises:
        ValueError: the answers are not the report's (another count, or another length of some answer).
    """
    rows = ngram["per_prompt"]
    if len(rows) != len(answers) or any(
        len(a) != r["new_tokens"] for a, r in zip(answers, rows, strict=False)
    ):
        raise ValueError("the plain answers are not the report's: pass the plain run of the same set")
    counts = {"repeating": [0, 0], "other": [0, 0]}
    for answer, row in zip(answers, rows, strict=True):
        part = counts[_part(row, threshold)]
        part[0] += len(answer)
        part[1] += sum(1 for t in answer if not in_vocab[t])
    return {name: (out / n if n else float("nan")) for name, (n, out) in counts.items()}


def _in_draft_vocab(drafter_dir: Path) -> list[bool]:
    from safetensors.torch import load_file

    weights = load_file(str(drafter_dir / "model.safetensors"))
    if "t2d" not in weights:
        raise SystemExit(f"{drafter_dir}: no draft vocabulary (t2d) in model.safetensors")
    return [bool(x) for x in weights["t2d"].tolist()]


def table(parts: dict[str, Part]) -> str:
    total = sum(p.tokens for p in parts.values()) or 1
    rows = []
    for name, p in parts.items():
        ratio = p.tau_drafter / p.tau_ngram if p.answers else float("nan")
        rows.append(
            [
                name,
                p.answers,
                f"{p.tokens / total:.0%}",
                f"{p.tau_ngram:.3f}",
                f"{p.tau_drafter:.3f}",
                f"{ratio:.2f}x",
            ]
        )
    header = ["answers", "count", "share of tokens", "ngram tau", "drafter tau", "drafter / ngram"]
    return "\n".join(md_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "ngram", type=Path, help="prompt lookup's eval report (`draftsmith eval --drafter ngram`)"
    )
    parser.add_argument("drafter", type=Path, help="the drafter's eval report on the same prompts")
    parser.add_argument(
        "--threshold",
        type=float,
        default=2.0,
        help="prompt lookup's per-answer tau that marks a repeating answer",
    )
    parser.add_argument(
        "--plain",
        type=Path,
        help="the set's plain answers (bench.scaling's SET-plain.json), with --draft-vocab",
    )
    parser.add_argument(
        "--draft-vocab",
        type=Path,
        help="the drafter's final/ directory: also the share of tokens outside its vocabulary",
    )
    args = parser.parse_args()
    reports = [json.loads(p.read_text()) for p in (args.ngram, args.drafter)]
    print(table(split(reports[0], reports[1], args.threshold)))
    if args.plain and args.draft_vocab:
        answers = json.loads(args.plain.read_text())["answers"]
        shares = outside_vocab(reports[0], answers, _in_draft_vocab(args.draft_vocab), args.threshold)
        print(
            "\n".join(
                f"{name}: {share:.1%} of the tokens outside the draft vocabulary"
                for name, share in shares.items()
            )
        )


if __name__ == "__main__":
    main()
