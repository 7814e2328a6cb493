"""`engine-eval --depths`: the depth prediction (eval/depth.py) checked against vLLM's measured speedup at several K.

The evaluator's report predicts speedup(K) from its acceptance by depth and its own decoding loop's costs. A
serving engine has other costs, so the prediction for vLLM keeps what the evaluator knows of the steps (how many
tokens, how many steps, how many of them carried drafts, at each K: a `Schedule`) and takes its costs from vLLM,
measured at one depth D only, in the classic form of the speculative-decoding speedup (Leviathan et al. 2023):

    speedup_vllm(K) = tokens(K) / (steps(K) + drafting(K) * K * c),     c from vLLM's measured speedup at D

in plain decoding steps: plain decoding takes one step a token; a speculative step verifies K + 1 tokens at
about the cost of one plain step (a forward that small is bound by reading the weights), and a step that carried
drafts adds K draft tokens at c plain steps each. At D the prediction is the measured speedup by construction;
every other measured K checks it: |predicted - measured| / measured against --max-speedup-diff (ALGORITHMS.md
9.8).

A trained drafter drafts at every step, and the first K tokens of its depth-D drafts are its depth-K drafts, so
its schedule per token follows from the acceptance by depth: tokens(K) / steps(K) = tau(K), every step drafting
(`acceptance_schedules`), which reduces the speedup to tau(K) / (1 + K c). Prompt lookup breaks both: a step
drafts only where the context repeats, and a long copied run is accepted over several steps whose number depends
on K. At T = 0 its schedule is exact instead: the answers are the plain ones at every K (lossless), and its
drafts depend only on the context, so replaying the answers through the same proposer gives each K's steps
(`ngram_schedules`).

The evaluator's own cost profile (the `speedup_evaluator_costs` column) is not used for vLLM: measured on
SmolLM2 it grew by a quarter of a step between verifying 3 and 4 tokens in transformers, where vLLM's step
cost grew evenly with K, and a prediction built on it missed vLLM by 72 % at K = 1 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from draftsmith.eval.depth import expected_tokens, off_reason, recommend

from .settings import EngineEvalArgs
from .vllm_engine import VllmRun


@dataclass(frozen=True)
class Schedule:
    """Decoding at one depth K, counted in target steps: `tokens` decoded in `steps` forwards, `drafting` of
    which verified drafts and accepted `accepted` draft tokens in all (totals, or per step: only the ratios
    matter)."""

    tokens: float
    steps: float
    drafting: float
    accepted: float

    @property
    def tau_vllm(self) -> float:
        """vLLM's mean acceptance length: 1 + the accepted draft tokens per step that carried drafts."""
        return 1.0 + self.accepted / self.drafting if self.drafting else 1.0

    def speedup(self, depth: int, cost: float) -> float:
        """Over plain decoding (a step a token) when a draft token costs `cost` plain steps."""
        return self.tokens / (self.steps + self.drafting * depth * cost)

    def draft_cost(self, depth: int, measured_speedup: float) -> float:
        """c: the draft token's cost in plain steps that makes `speedup(depth, c)` the measured speedup; 0 when
        the measured steps are no dearer than plain ones (timing noise) or nothing was drafted."""
        if not self.drafting or measured_speedup <= 0:
            return 0.0
        return max(0.0, (self.tokens / measured_speedup - self.steps) / (self.drafting * depth))


def acceptance_schedules(acceptance: Sequence[float | None]) -> dict[int, Schedule]:
    """A drafter that drafts at every step: per step, tau(K) tokens (ALGORITHMS.md 9.5), for K = 1 up to the
    first depth without a rate (a depth no step reached is not extrapolated)."""
    measured: list[float] = []
    for rate in acceptance:
        if rate is None:
            break
        measured.append(rate)
    taus = {k: expected_tokens(measured, k) for k in range(1, len(measured) + 1)}
    return {k: Schedule(tau, 1.0, 1.0, tau - 1.0) for k, tau in taus.items()}


class Proposer(Protocol):
    def continuations(self, context: list[int], depth: int, limit: int) -> list[list[int]]: ...


def ngram_schedules(
    proposer: Proposer, prompts: Sequence[list[int]], answers: Sequence[list[int]], depths: Sequence[int]
) -> dict[int, Schedule]:
    """Prompt lookup's exact schedule at each depth at T = 0: the greedy `answers` replayed through `proposer`.
    The first token of an answer comes from the prompt's forward (a step without drafts); each later step
    drafts the proposer's first continuation of the context, K tokens at most, and accepts its longest prefix
    that the answer continues with, plus the target's own next token."""
    schedules = {}
    for k in depths:
        tokens = steps = drafting = accepted_all = 0
        for prompt, answer in zip(prompts, answers, strict=True):
            if not answer:
                continue
            tokens, steps, pos = tokens + len(answer), steps + 1, 1
            while pos < len(answer):
                found = proposer.continuations(prompt + answer[:pos], k, 1)
                draft = found[0] if found else []
                accepted = 0
                while (
                    accepted < min(len(draft), len(answer) - pos)
                    and draft[accepted] == answer[pos + accepted]
                ):
                    accepted += 1
                steps, drafting, pos = steps + 1, drafting + bool(draft), pos + accepted + 1
                accepted_all += accepted
        schedules[k] = Schedule(float(tokens), float(steps), float(drafting), float(accepted_all))
    return schedules


def replayed_schedules(
    args: EngineEvalArgs, prompts: Sequence[list[int]], plain: Sequence[dict[str, Any]]
) -> dict[int, Schedule] | None:
    """Prompt lookup's steps at K = 1..max(--depths), replayed from vLLM's plain answers (`plain`, its outputs)
    through the proposer vLLM runs (the earliest occurrence of the longest match); None for a trained drafter
    (its acceptance by depth gives them) or a sampled run (its answers differ from the plain ones)."""
    if args.drafter != "ngram" or args.temperature != 0:
        return None
    from draftsmith.eval.drafters.ngram import NgramDrafter  # imports torch: only where it is needed

    proposer = NgramDrafter(max_ngram=args.ngram_max, min_ngram=args.ngram_min, match="earliest")
    answers = [list(o["token_ids"]) for o in plain]
    return ngram_schedules(proposer, prompts, answers, range(1, max(args.depths) + 1))


def vllm_prediction(
    schedules: Mapping[int, Schedule], plain_tokens_per_s: float, at_tokens_per_s: float, depth: int
) -> tuple[float, list[float]] | None:
    """`(c, speedup_vllm(K) for K = 1..max(schedules))`, calibrated on vLLM's speed at `depth` and its plain
    speed; None where `depth` has no schedule or a speed is missing. `schedules` must hold every K from 1."""
    if depth not in schedules or plain_tokens_per_s <= 0 or at_tokens_per_s <= 0:
        return None
    c = schedules[depth].draft_cost(depth, at_tokens_per_s / plain_tokens_per_s)
    return c, [schedules[k].speedup(k, c) for k in range(1, max(schedules) + 1)]


def depth_check(
    ours: dict[str, Any],
    plain: VllmRun,
    runs: Mapping[int, VllmRun],
    calibrated_at: int,
    tolerance: float,
    schedules: Mapping[int, Schedule] | None = None,
) -> dict[str, Any]:
    """The report's `depth_check`: per measured K, the predicted tau (vLLM's definition) and vLLM's, the
    prediction for vLLM and vLLM's measured speedup with their relative difference; the largest difference over
    the depths other than the calibration's, whether it is within `tolerance`, and the fastest K predicted and
    measured. `schedules` (K = 1..max) default to the evaluator's acceptance by depth (`acceptance_schedules`)."""
    own = ours.get("expected_speedup_by_depth") or []
    if schedules is None:
        schedules = acceptance_schedules(ours.get("acceptance_by_depth") or [])
    at = runs[calibrated_at]
    calibrated = vllm_prediction(schedules, plain.tokens_per_s or 0.0, at.tokens_per_s or 0.0, calibrated_at)
    cost, predicted = calibrated if calibrated else (None, [])
    rows = []
    for k in sorted(runs):
        run = runs[k]
        measured = run.tokens_per_s / plain.tokens_per_s if run.tokens_per_s and plain.tokens_per_s else None
        guess = predicted[k - 1] if k <= len(predicted) else None
        rel = (guess - measured) / measured if guess is not None and measured else None
        rows.append(
            {
                "depth": k,
                "tau_predicted": schedules[k].tau_vllm if k in schedules else None,
                "tau_vllm": run.mean_acceptance_length,
                "speedup_predicted": guess,
                "speedup_measured": measured,
                "tokens_per_s": run.tokens_per_s,
                "relative_difference": rel,
                "speedup_evaluator_costs": own[k - 1] if k <= len(own) else None,
                "speculative_equals_plain": sum(
                    a["token_ids"] == b["token_ids"] for a, b in zip(run.outputs, plain.outputs, strict=True)
                ),
            }
        )
    checked = [r["relative_difference"] for r in rows if r["depth"] != calibrated_at]
    worst = max((abs(d) for d in checked if d is not None), default=None)
    measured_speedups = {r["depth"]: r["speedup_measured"] for r in rows if r["speedup_measured"] is not None}
    best_measured = max(measured_speedups, key=lambda k: measured_speedups[k], default=None)
    return {
        "calibrated_at": calibrated_at,
        "plain_tokens_per_s": plain.tokens_per_s,
        "draft_cost_ratio": cost,
        "rows": rows,
        "max_relative_difference": worst,
        "tolerance": tolerance,
        "within_tolerance": worst is not None and None not in checked and worst <= tolerance,
        "predicted_speedup_by_depth": predicted,
        "recommended_depth": recommend(predicted)[0] if predicted else None,
        "fastest_measured_depth": best_measured,
    }


def measured_off_reason(check: dict[str, Any]) -> str:
    """Why vLLM served no depth faster than plain decoding and what to do (`eval.depth.off_reason`), from its own
    runs: its mean acceptance length and measured speedup at depths 1, 2, ... in a row."""
    rows = {r["depth"]: r for r in check["rows"] if r.get("tau_vllm") and r.get("speedup_measured")}
    if 1 not in rows:  # the reason is read at depth 1 (--depths without 1, or its run measured nothing)
        return "serve prompt lookup (ngram), or train on more of the target's answers"
    depths = sorted(rows)  # depth 1 first; the others only add to the data estimate
    return off_reason([rows[k]["tau_vllm"] for k in depths], [rows[k]["speedup_measured"] for k in depths])
