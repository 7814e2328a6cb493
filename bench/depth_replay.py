r"""Prompt lookup's depth prediction, recomputed for an `engine-eval --drafter ngram --depths` report (docs/BENCHMARKS.md,
"The depth that is fastest"):

    python -m bench.depth_replay --report ngram-depths.json [--counts ngram-depth1.json ...]

The report keeps vLLM's measured speed and counters at every depth, not the answers, so this decodes the
report's prompts once more with draftsmith's evaluator (the same settings engine-eval used; at T = 0 its
answers equal vLLM's, which the report checked), replays prompt lookup through them at every depth
(engines/depth_check.py `replayed_schedules`) and prints, per depth, the replayed drafting steps and accepted
tokens against vLLM's counters (from the report and from any `--counts` reports of the same prompts at other
depths), and the predicted speedup against the measured one, calibrated at the report's depth as engine-eval
calibrates it. A report written after the replay was committed carries the same predictions itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draftsmith.engines.depth_check import replayed_schedules, vllm_prediction
from draftsmith.engines.engine_eval import evaluator_settings
from draftsmith.engines.settings import EngineEvalArgs, build_parser, parse_engine_eval_args
from draftsmith.eval.acceptance import evaluate
from draftsmith.eval.report import TurnResult
from draftsmith.runtime.display import table as md_table


def settings_of(report: dict[str, Any], depths: list[int]) -> EngineEvalArgs:
    """The engine-eval settings the report was measured with, through engine-eval's own parser."""
    s = report["settings"]
    argv = ["--target", s["target"], "--drafter", report["drafter"], "--data", s["data"]]
    argv += ["--num-prompts", str(s["num_prompts"]), "--max-new-tokens", str(s["max_new_tokens"])]
    argv += ["--temperature", str(s["temperature"]), "--depths", ",".join(map(str, depths))]
    return parse_engine_eval_args(build_parser(__doc__ or ""), argv)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--report", type=Path, required=True, help="an engine-eval --drafter ngram --depths report"
    )
    p.add_argument("--counts", type=Path, nargs="*", default=[], help="engine-eval reports at other depths")
    args = p.parse_args()
    report = json.loads(args.report.read_text())
    check = report["depth_check"]
    depths = [r["depth"] for r in check["rows"]]
    eargs = settings_of(report, depths)
    turns: list[TurnResult] = []
    evaluate(evaluator_settings(eargs), record=turns)
    prompts = [t.prompt or [] for t in turns]
    plain = [{"token_ids": t.spec.tokens} for t in turns]
    schedules = replayed_schedules(eargs, prompts, plain)
    assert schedules is not None
    counters = {check["calibrated_at"]: report["vllm"]["counters"]}
    for extra in args.counts:
        other = json.loads(extra.read_text())
        counters[int(other["settings"]["depth"])] = other["vllm"]["counters"]
    rows = {r["depth"]: r for r in check["rows"]}
    at = rows[check["calibrated_at"]]
    calibrated = vllm_prediction(
        schedules, check["plain_tokens_per_s"], at["tokens_per_s"], check["calibrated_at"]
    )
    assert calibrated is not None
    cost, predicted = calibrated
    print(f"c = {cost:.3f} plain steps per draft token, calibrated at depth {check['calibrated_at']}")
    header = [
        "depth K",
        "drafting steps replayed / vLLM",
        "accepted replayed / vLLM",
        "tau replayed",
        "tau vLLM",
    ]
    header += ["speedup predicted", "measured", "difference"]
    cells = []
    for k in sorted(schedules):
        s, c, row = schedules[k], counters.get(k), rows.get(k)
        vllm_counts = (c["num_drafts"], c["num_accepted_tokens"]) if c else ("-", "-")
        measured = row["speedup_measured"] if row else None
        diff = f"{(predicted[k - 1] - measured) / measured * 100:+.1f} %" if measured else "-"
        cells.append(
            [
                k,
                f"{s.drafting:.0f} / {vllm_counts[0]}",
                f"{s.accepted:.0f} / {vllm_counts[1]}",
                f"{s.tau_vllm:.3f}",
            ]
            + [
                row["tau_vllm"] if row else "-",
                f"{predicted[k - 1]:.2f}",
                f"{measured:.2f}" if measured else "-",
                diff,
            ]
        )
    print("\n".join(md_table(header, cells)))


if __name__ == "__main__":
    main()
