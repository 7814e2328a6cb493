"""Measure a drafter by real speculative decoding against the real target on held-out prompts.

    draftsmith eval --target DIR_OR_HUB_ID --drafter CKPT|ngram|self|HF_DIR --data FILE [options]
    python -m draftsmith.eval.acceptance ...   (the same)

Each conversation's prompt is everything up to its last user turn, rendered with the target's chat template
and generation prompt. Multi-turn items (MT-bench) run every turn, each conditioned on the model's own
earlier answers. Prints a Markdown table; writes a JSON report (--report), a bar plot of acceptance by depth
(--plot) and, with --save-eval, the report as eval.json in the drafter checkpoint. --min-tau X is the
deployment gate (eval/gate.py): exit status 3 when tau < X or the lossless check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import prompt_turns, read_conversations, with_answers
from draftsmith.data.fingerprint import source_hashes
from draftsmith.data.formats import Conversation
from draftsmith.eval.decoder import Generation, SpeculativeDecoder, plain_decode
from draftsmith.eval.depth import Calibration, prediction, unpredicted
from draftsmith.eval.drafters import load_drafter_spec, served_target
from draftsmith.eval.drafters.base import Drafter
from draftsmith.eval.drift import adapter_drift
from draftsmith.eval.gate import FAIL, check_min_tau, gate
from draftsmith.eval.report import (
    TurnResult,
    check_report_path,
    markdown,
    per_prompt_rows,
    plot_acceptance,
    summarize,
)
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.settings import EvalArgs, parse_eval_args
from draftsmith.eval.settings import build_parser as build_eval_parser
from draftsmith.eval.spans import token_spans
from draftsmith.eval.tree import TreeShape, parse_tree
from draftsmith.models.claims import drafter_record
from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
from draftsmith.runtime.display import pyplot
from draftsmith.runtime.errors import run_main
from draftsmith.runtime.files import check_output_file, draftsmith_version, write_json

logger = logging.getLogger(__name__)


# What to do with the report, not how it was measured: kept out of the report's settings.
NOT_SETTINGS = ("progress", "report", "plot", "save_eval", "min_tau")


def build_parser() -> argparse.ArgumentParser:
    return build_eval_parser(__doc__ or "")


def parse(argv: Sequence[str] | None) -> EvalArgs:
    """The evaluator's settings from a command line (`--config FILE`, `KEY=VALUE`, `--flags`)."""
    return parse_eval_args(build_parser(), argv)


def evaluate(
    args: EvalArgs, target: Any = None, drafter: Any = None, record: list[Any] | None = None
) -> dict[str, Any]:
    """Run the evaluation `args` describes and return the report (see eval/report.py for the metrics).

    `target` / `drafter` may be passed pre-loaded (tests, benchmarks); otherwise they are loaded from args.
    `record`, when given, receives every answer's `TurnResult` (its prompt ids and decoding steps included).
    """
    sampling = check_settings(args)
    convs = read_prompts(args)
    if target is None:
        target = load_target(args)
    original = None
    served = served_target(args.drafter, target)  # the drafter's family says whether it changes the target
    if served is not None:  # e.g. Medusa-2: the adapted target is what gets served, so it is what is measured
        original, target = target, served
    if drafter is None:
        drafter = load_drafter_spec(args.drafter, target, args.ngram_max, args.ngram_min, args.ngram_match)
    depth, shape = draft_shape(args, drafter, sampling)
    decoding = start_decoding(args, target, drafter, shape, sampling)
    decoding.warm_up(convs[0])
    turns, skipped = decoding.decode_all(convs)

    report = summarize(turns)
    report.update(depth_prediction(report, decoding, convs[0], shape))
    if record is not None:
        record.extend(turns)
    if original is not None:
        report["adapter_drift"] = drift_of_adapter(
            original, target, convs, decoding.max_pos, args.max_new_tokens
        )
    rows, lossless = per_prompt_verdicts(turns, args.check_lossless)
    report.update(
        {
            "num_prompts": len({t.item for t in turns}),
            "num_turns": len(turns),
            "skipped_turns": skipped,
            "lossless": lossless,
            "settings": report_settings(args, depth, shape, drafter, target),
            "measured": measured(args, drafter, target, turns),
            "per_prompt": rows,
        }
    )
    return report


def measured(args: EvalArgs, drafter: Any, target: FrozenTarget, turns: list[TurnResult]) -> dict[str, Any]:
    """What the report measured (models/claims.py): the drafter by its weights' sha256, the target by its
    identity, the data by its content and the prompts and tokens it gave."""
    return {
        "drafter": drafter_record(args.drafter, getattr(drafter, "name", type(drafter).__name__)),
        "target": target.identity(),
        "data": {
            "source": args.data,
            "sha256": source_hashes([args.data]).get(args.data),
            "prompts": len({t.item for t in turns}),
            "turns": len(turns),
            "prompt_tokens": sum(t.prompt_tokens for t in turns),
            "new_tokens": sum(len(t.spec.tokens) for t in turns),
        },
    }


def check_settings(args: EvalArgs) -> Sampling:
    """The sampling settings, once settings that contradict each other and a bad --tree are refused (before
    anything is loaded)."""
    check_min_tau(args.min_tau)
    sampling = Sampling(args.temperature, args.top_p, args.top_k)  # refuses NaN, infinity, negatives
    if args.check_lossless and not sampling.greedy:
        raise ValueError("--check-lossless compares with greedy decoding: it needs --temperature 0")
    if args.check_lossless and not args.baseline:
        raise ValueError("--check-lossless needs the plain-decoding baseline: drop --no-baseline")
    if args.num_prompts < 0 or args.max_new_tokens < 1:
        raise ValueError("--num-prompts must be >= 0 and --max-new-tokens >= 1")
    parse_tree(args.tree, args.depth if args.depth is not None else 1)  # a bad --tree fails before loading
    return sampling


def read_prompts(args: EvalArgs) -> list[Conversation]:
    """The conversations of --data with a user turn to prompt with: the first --num-prompts (0: all)."""
    convs = read_conversations(args.data, args.format)
    convs = [c for c in convs if prompt_turns(c)]
    if not convs:
        raise ValueError(f"--data {args.data}: no conversation with a user turn to use as a prompt")
    if args.num_prompts:
        if args.num_prompts > len(convs):
            logger.warning(
                "--num-prompts %d: %s has only %d usable conversations; evaluating those",
                args.num_prompts,
                args.data,
                len(convs),
            )
        convs = convs[: args.num_prompts]
    return convs


def load_target(args: EvalArgs) -> FrozenTarget:
    """The target of --target in --dtype, on --device (auto: a GPU when there is one)."""
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    config = TargetConfig(path=args.target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    return FrozenTarget.load(config, device)


def draft_shape(args: EvalArgs, drafter: Drafter, sampling: Sampling) -> tuple[int, TreeShape]:
    """`(depth, tree shape)`: --depth (default: the drafter's deepest, at most 5), --tree, and for a chain at
    T > 0 whether its drafts are sampled (--draft-sample-method)."""
    depth = args.depth if args.depth is not None else min(5, drafter.max_depth or 5)
    shape = parse_tree(args.tree, depth)
    if args.draft_sample_method != "auto" and not sampling.greedy:  # at T = 0 every draft is the argmax
        if not shape.is_chain:
            raise ValueError(
                f"--draft-sample-method {args.draft_sample_method} applies to chains; a tree says it itself "
                "(--tree topk:K ranks, sample:K samples)"
            )
        shape = dataclasses.replace(shape, sampled=args.draft_sample_method == "probabilistic")
    return depth, shape


def start_decoding(
    args: EvalArgs, target: FrozenTarget, drafter: Drafter, shape: TreeShape, sampling: Sampling
) -> Decoding:
    """The decoder and what decoding each prompt needs, once --max-new-tokens is checked against the
    target's context."""
    decoder = SpeculativeDecoder(
        target, drafter, shape, sampling, args.acceptance, args.kv_cache, args.drafts_at_budget
    )
    max_pos = getattr(target.model.config, "max_position_embeddings", None)
    if max_pos is not None and args.max_new_tokens >= max_pos:
        raise ValueError(
            f"--max-new-tokens must be in 1..{max_pos - 1}: the target's context holds {max_pos} positions, "
            "prompt included"
        )
    # full drafts at the budget verify up to `depth` positions past it
    overshoot = shape.depth if args.drafts_at_budget == "full" else 0
    return Decoding(args, target, decoder, sampling, stop_token_ids(target), max_pos, overshoot)


@dataclass
class Decoding:
    """Speculative decoding (and the plain-decoding baseline) of every prompt of one evaluation."""

    args: EvalArgs
    target: FrozenTarget
    decoder: SpeculativeDecoder
    sampling: Sampling
    stop_ids: set[int]
    max_pos: int | None  # the target's context, prompt included (None: unbounded)
    overshoot: int  # positions a step may verify past --max-new-tokens

    def generator(self, index: int, turn: int) -> torch.Generator:
        """The random stream of one answer: the same for speculative and plain decoding of it."""
        seed = self.args.seed * 1_000_003 + index * 101 + turn
        return torch.Generator(self.target.device).manual_seed(seed)

    def plain(self, prompt: list[int], max_new_tokens: int, generator: torch.Generator) -> Generation:
        """Plain decoding of `prompt`: the baseline for speedup and, at T = 0, the lossless check."""
        return plain_decode(
            self.target, prompt, max_new_tokens, self.sampling, generator, self.stop_ids, self.args.kv_cache
        )

    def warm_up(self, conv: Conversation) -> None:
        """One short decode of each kind, not measured: allocator, kernels and lazy imports would otherwise
        bill the first prompt."""
        warm = render_prompt(self.target.tokenizer, prompt_turns(conv)[0], conv.tools)[-64:]
        self.decoder.generate(warm, 8, self.generator(-1, 0))
        self.plain(warm, 8, self.generator(-1, 0))

    def cost_profile(self, conv: Conversation, max_tokens: int) -> list[float]:
        """Seconds of a verification forward over 1..max_tokens tokens after the first prompt of `conv` (its
        last tokens when the target's context could not hold it and them)."""
        prompt = render_prompt(self.target.tokenizer, prompt_turns(conv)[0], conv.tools)
        if self.max_pos is not None:
            prompt = prompt[-(self.max_pos - max_tokens) :]
        return self.decoder.verify_costs(prompt, max_tokens)

    def decode_all(self, convs: list[Conversation]) -> tuple[list[TurnResult], list[str]]:
        """Every answer to `convs`, and the turns skipped as longer than the target's context."""
        turns: list[TurnResult] = []
        skipped: list[str] = []
        bar = tqdm(convs, desc="eval", unit="prompt", disable=not self.args.progress)
        for index, conv in enumerate(bar):
            answered, skip = self.conversation(index, conv)
            turns += answered
            if skip is not None:
                skipped.append(skip)
            running = summarize(turns)["tau"] if turns else None
            bar.set_postfix(tau=f"{running:.3f}" if running else "-")
        if skipped:
            logger.warning(
                "skipped %d turns longer than the target's context: %s", len(skipped), "; ".join(skipped[:3])
            )
        if not turns:
            raise ValueError(
                "every prompt was longer than the target's context window; lower --max-new-tokens"
            )
        return turns, skipped

    def conversation(self, index: int, conv: Conversation) -> tuple[list[TurnResult], str | None]:
        """Every turn of `conv`, each prompted with the model's own earlier answers, up to the first turn
        that would not fit the target's context (then also what was skipped)."""
        item = conv.id or conv.source
        turns: list[TurnResult] = []
        answers: list[str] = []
        for k, prompt_msgs in enumerate(prompt_turns(conv)):
            prompt = render_prompt(self.target.tokenizer, with_answers(prompt_msgs, answers), conv.tools)
            budget = self.args.max_new_tokens + self.overshoot
            if self.max_pos is not None and len(prompt) + budget > self.max_pos:
                return turns, f"{item} turn {k}: {len(prompt)} prompt tokens + {budget} > {self.max_pos}"
            turns.append(self.turn(index, item, k, prompt, conv))
            text_ids = [t for t in turns[-1].spec.tokens if t not in self.stop_ids]
            answers.append(self.target.tokenizer.decode(text_ids, skip_special_tokens=True))
        return turns, None

    def turn(self, index: int, item: str, k: int, prompt: list[int], conv: Conversation) -> TurnResult:
        """Turn `k` of `conv` decoded speculatively and, with --baseline, plainly from the same seed."""
        max_new = self.args.max_new_tokens
        spec = self.decoder.generate(prompt, max_new, self.generator(index, k))
        base = self.plain(prompt, max_new, self.generator(index, k)) if self.args.baseline else None
        spans = token_spans(self.target.tokenizer, prompt, spec.tokens)
        return TurnResult(item, k, len(prompt), spec, base, prompt, conv.category, spans, bool(conv.tools))


def depth_prediction(
    report: dict[str, Any], decoding: Decoding, conv: Conversation, shape: TreeShape
) -> dict[str, Any]:
    """The report's recommended depth (eval/depth.py) from its acceptance by depth, its drafting cost and a
    verification cost profile up to the run's depth + 1 tokens; a tree run predicts nothing (the prediction is
    for chains, whose verification of K drafts is K + 1 tokens)."""
    if not shape.is_chain:
        return unpredicted()
    verify = decoding.cost_profile(conv, shape.depth + 1)
    calibration = Calibration.from_report(report, shape.depth, verify)
    return prediction(report["acceptance_by_depth"], report["draft_cost_s"], verify, calibration)


def drift_of_adapter(
    original: FrozenTarget,
    adapted: FrozenTarget,
    convs: list[Conversation],
    max_pos: int | None,
    max_new: int,
) -> dict[str, Any]:
    """Medusa-2's `adapter_drift` over each conversation's first prompt that fits the target's context."""
    firsts = [render_prompt(adapted.tokenizer, prompt_turns(c)[0], c.tools) for c in convs]
    fits = [p for p in firsts if max_pos is None or len(p) + max_new <= max_pos]
    return adapter_drift(original, adapted, fits, max_new)


def per_prompt_verdicts(
    turns: list[TurnResult], check_lossless: bool
) -> tuple[list[dict[str, Any]], bool | None]:
    """The per-answer rows and the lossless verdict: with --check-lossless each row says whether the answer
    matches greedy plain decoding (`matches_greedy`) and the verdict whether all do; else None."""
    rows = per_prompt_rows(turns)
    if not check_lossless:
        return rows, None
    for row, t in zip(rows, turns, strict=True):
        row["matches_greedy"] = t.baseline is not None and t.spec.tokens == t.baseline.tokens
    return rows, all(r["matches_greedy"] for r in rows)


def report_settings(
    args: EvalArgs, depth: int, shape: TreeShape, drafter: Any, target: FrozenTarget
) -> dict[str, Any]:
    """The report's `settings`: how it was measured (the arguments but what to do with the report), the
    drafter, the target's identity and the software and hardware versions."""
    return {
        **{k: v for k, v in asdict(args).items() if k not in NOT_SETTINGS},
        "depth": depth,
        "max_draft_tokens": shape.num_draft,
        "drafter_kind": getattr(drafter, "name", type(drafter).__name__),
        "target_identity": target.identity(),
        "versions": _versions(target.device),
    }


def _versions(device: torch.device) -> dict[str, Any]:
    """The software and the hardware that measured the report."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {
        "draftsmith": draftsmith_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "cpu_threads": torch.get_num_threads(),
    }


def check_outputs(args: EvalArgs) -> None:
    """Everything the end of the run needs, checked before the first measurement: the report and plot paths
    writable, matplotlib installed for --plot, the drafter a checkpoint for --save-eval."""
    if args.save_eval and not (Path(args.drafter) / "config.json").is_file():
        raise ValueError("--save-eval writes eval.json into a draftsmith checkpoint; --drafter is not one")
    if args.report:
        check_output_file(Path(args.report), "--report")
        check_report_path(Path(args.report))
    if args.plot:
        check_output_file(Path(args.plot), "--plot")
        pyplot()  # one line naming the install when matplotlib is missing


def run(args: EvalArgs) -> int:
    check_outputs(args)
    report = evaluate(args)
    print(markdown(report))
    if report["lossless"] is False:
        bad = [f"{r['id']} turn {r['turn']}" for r in report["per_prompt"] if not r["matches_greedy"]]
        print(f"LOSSLESS CHECK FAILED: {len(bad)} answers differ from greedy decoding: {', '.join(bad[:5])}")
    if args.report:  # the measurement's results first: an optional plot that fails must not lose them
        write_json(Path(args.report), report)
        print(f"report: {args.report}")
    if args.save_eval:
        write_json(Path(args.drafter) / "eval.json", report)
        print(f"report saved in the checkpoint: {Path(args.drafter) / 'eval.json'}")
    if args.plot:
        plot_acceptance(report, Path(args.plot))
        print(f"plot: {args.plot}")
    if args.min_tau is not None:  # the deployment gate: the same rule as `draftsmith gate --min-tau`
        passed, reason = gate(report, None, args.min_tau, max_drop=0.0)
        if not passed:
            print(f"gate failed: {reason} (drafter {args.drafter})", file=sys.stderr)
            return FAIL
    if report["lossless"] is False:
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse(argv)
    return run_main(lambda _: run(args), [])


if __name__ == "__main__":
    sys.exit(main())
