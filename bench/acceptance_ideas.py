r"""Training ideas against today's recipe on the same samples and steps (docs/BENCHMARKS.md, "Acceptance per
token"), ranked by paired comparisons (`draftsmith compare`).

    python -m bench.acceptance_ideas --run runs/quickstart/eagle3-480-HASH --idea reach1=draft.reach_topk=1 \
        [--idea NAME=KEY=VALUE[,KEY=VALUE...] ...] [--set NAME=DATA@PROMPTS ...] [--eval-tokens 96] \
        [--depth 5] [--out runs/ideas]

--run is a finished EAGLE-3 run (the quickstart's stage 4, or any `draftsmith train eagle` run from a cache):
its resolved config.yaml holds the samples (the cache), the steps (epochs, batch) and every setting. Each idea
trains with that config and its overrides only, so the reference and the idea see the same samples in the
same order for the same steps. Then every drafter (the run's own, each idea's, and ngram) decodes each set at
T = 0 as a chain of --depth (no plain-decoding pass: tau needs none, and every drafter of one set decodes the
same prompts), and `draftsmith compare` ranks each against the run's own drafter with the paired standard
error. Resumable: a trained idea and a written report are kept. The tables go to stdout and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.real_target import SHARED, cli, run

DEFAULT_SETS = [
    "heldout=prompts:heldout@16",
    f"mt_bench={SHARED / 'mt_bench/question.jsonl'}@40",
    f"gsm8k={SHARED / 'gsm8k/test.jsonl'}@60",
    f"humaneval={SHARED / 'humaneval/HumanEval.jsonl.gz'}@60",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.acceptance_ideas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--run", type=Path, required=True, help="the reference EAGLE-3 run (its config.yaml, final/)"
    )
    p.add_argument(
        "--idea",
        action="append",
        default=[],
        metavar="NAME=OVERRIDES",
        help="an idea: its name and comma-separated recipe overrides, e.g. ttt5=draft.ttt_steps=5 (repeatable)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="NAME=DATA@PROMPTS",
        help="an evaluation set and how many of its prompts (repeatable; default: held-out, MT-bench 40, GSM8K "
        "60, HumanEval 60)",
    )
    p.add_argument("--eval-tokens", type=int, default=96, help="max new tokens per answer")
    p.add_argument("--depth", type=int, default=5, help="the chain's depth")
    p.add_argument("--out", type=Path, default=Path("runs/ideas"))
    return p


def parse_ideas(items: list[str]) -> dict[str, list[str]]:
    ideas = {}
    for item in items:
        name, sep, overrides = item.partition("=")
        if not sep or not name or not overrides:
            raise SystemExit(f"--idea {item!r}: give NAME=KEY=VALUE[,KEY=VALUE...]")
        ideas[name] = overrides.split(",")
    return ideas


def parse_sets(items: list[str]) -> dict[str, tuple[str, int]]:
    sets = {}
    for item in items:
        name, _, rest = item.partition("=")
        data, _, prompts = rest.rpartition("@")
        if not name or not data or not prompts.isdigit():
            raise SystemExit(f"--set {item!r}: give NAME=DATA@PROMPTS")
        sets[name] = (data, int(prompts))
    return sets


def reference_target(run_dir: Path) -> str:
    """The target the reference run trained against, from its resolved config.yaml."""
    return str(yaml.safe_load((run_dir / "config.yaml").read_text())["target"]["path"])


def train_idea(run_dir: Path, name: str, overrides: list[str], out: Path) -> Path:
    """The idea trained with the reference run's resolved config and `overrides` (kept when already done)."""
    idea_dir = out / "train" / name
    if not (idea_dir / "final").is_dir():
        print(f"[train] {name}: {' '.join(overrides)}", flush=True)
        t0 = time.perf_counter()
        cmd = cli("train", "eagle", "--config", str(run_dir / "config.yaml"), f"output_dir={idea_dir}")
        run([*cmd, *overrides, "--resume"], out / "logs" / f"train-{name}.log")
        (idea_dir / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return idea_dir / "final"


def evaluate(
    target: str, drafter: str, data: str, prompts: int, args: argparse.Namespace, report: Path
) -> Path:
    if not report.is_file():
        print(f"[eval] {report.parent.name}/{report.stem}", flush=True)
        cmd = cli(
            *("eval", "--target", target, "--drafter", drafter, "--data", data),
            *("--num-prompts", str(prompts), "--max-new-tokens", str(args.eval_tokens)),
            *("--depth", str(args.depth), "--tree", "chain", "--no-baseline", "--no-progress"),
            *("--report", str(report)),
        )
        run(cmd, args.out / "logs" / f"eval-{report.parent.name}-{report.stem}.log")
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ideas = parse_ideas(args.idea)
    sets = parse_sets(args.set or DEFAULT_SETS)
    target = reference_target(args.run)
    drafters = {"recipe": args.run / "final"}
    drafters.update({name: train_idea(args.run, name, o, args.out) for name, o in ideas.items()})
    lines = [
        f"reference: {args.run} (the recipe); T = 0, chain of depth {args.depth}, {args.eval_tokens} tokens"
    ]
    for set_name, (data, prompts) in sets.items():
        reports = [
            evaluate(target, str(ckpt), data, prompts, args, args.out / "eval" / set_name / f"{name}.json")
            for name, ckpt in {**drafters, "ngram": "ngram"}.items()
        ]
        table = args.out / "eval" / set_name / "compare.md"
        with table.open("w") as f:  # run beside the reports, so that the table names them by file name
            run_compare = cli("compare", *(r.name for r in reports), "--json", "compare.json")
            subprocess.run(run_compare, stdout=f, check=True, cwd=table.parent)
        lines += ["", f"### {set_name} ({prompts} prompts of {data})", "", table.read_text().strip()]
        depth_rows = {r.stem: json.loads(r.read_text())["acceptance_by_depth"] for r in reports}
        lines += [
            "",
            "acceptance by depth: "
            + "; ".join(
                f"{n} {' '.join(f'{a:.2f}' for a in rates if a is not None)}"
                for n, rates in depth_rows.items()
            ),
        ]
    walls = {n: (args.out / "train" / n / "wall_s.txt") for n in ideas}
    lines += [
        "",
        "training wall time: "
        + ", ".join(f"{n} {float(p.read_text()):.0f} s" for n, p in walls.items() if p.is_file()),
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
