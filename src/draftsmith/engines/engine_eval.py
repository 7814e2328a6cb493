"""`draftsmith engine-eval`: the engine users serve with measures the same drafter on the same prompts.

    draftsmith engine-eval --engine vllm --target DIR --drafter CKPT|ngram --data FILE
        [--num-prompts N] [--max-new-tokens M] [--depth K] [--temperature X]
        [--draft-sample-method greedy|probabilistic] [--batch-size B] [--report R] [--max-rel-diff 0.03]
        [--plain-cache DIR] [--concurrency 1,2,4,8] [--context-lengths 512,2048] [--plot P]
        [--depths 1,2,3,5] [--max-speedup-diff 0.15]

draftsmith's evaluator decodes the prompts first (a chain, batch size 1, float32); the exact prompt token ids
it rendered then go to vLLM, which serves the target twice in the engine's venv (`draftsmith engine-setup
vllm`): plainly, and with the drafter exported to vLLM's layout (`draftsmith export --to vllm`). The table
puts vLLM's mean acceptance length, its acceptance per position and its tokens/s next to the evaluator's
figures for the same drafter, with the relative difference of tau; at T = 0 it also checks that vLLM's
speculative answers equal its plain answers token for token. vLLM's mean acceptance length counts only the
steps that carried drafts; the evaluator's tau counts every verification step, so the check compares vLLM's
figure with the evaluator's steps counted the same way (equal to tau unless a step drafts nothing, which the
n-gram proposer does); both differences are printed. The evaluator follows two more of vLLM's rules here: the
ngram drafter continues the earliest occurrence of the longest match, and drafts keep their full depth at
--max-new-tokens (vLLM's scheduler schedules no partial drafts, and it counts the acceptances that fall past
max_tokens; the answers are cut at the budget either way). vLLM runs without prefix caching: a request whose
prompt is cached up to its last token is padded to a decoding step with --depth placeholder drafts, which vLLM
counts as a drafted step with nothing accepted (the warm-up request caches the first prompt, a second turn the
first). The exit status is 3 when the difference is above
--max-rel-diff (at T > 0, where the engines sample different answers, above 3 standard errors of the difference
if that is more) or a lossless check failed.

A drafter family vLLM does not serve (for this target) is refused before anything runs, naming why, and so is
every other option that could fail later: the --report and --plot paths, matplotlib for --plot, --work-dir and
--plain-cache, and the long prompts of --context-lengths (checked against the target's positions right after it
loads). The report is written before the optional plot; a failed plot is one line and the report stays. Without
--work-dir a failed vLLM run's logs are copied out of the temporary directory (to
$DRAFTSMITH_CACHE/engine-eval-logs/) and the error names the copies. --plain-cache keys a kept plain run by the
target's content (its weights, config and tokenizer fingerprints), not by its path.

`--depths` measures the depth to serve with and checks its prediction: vLLM decodes the same prompts at each
depth, and the speedup predicted from the evaluator's acceptance by depth, tau(K) / (1 + K c), with c (a draft
token's cost in plain steps) taken from vLLM's speed at the evaluator's depth (engines/depth_check.py), is set
against the measured one at every other depth; the exit status is 3 when one misses by more than
--max-speedup-diff, or a depth's answers differ from plain decoding at T = 0.

`--concurrency` and `--context-lengths` then measure where speculation stops paying: vLLM's own server with and
without the drafter, requests in flight or long prompts (engines/load_curves.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftsmith.eval.gate import FAIL
from draftsmith.eval.settings import EvalArgs
from draftsmith.models.families import family
from draftsmith.models.serving import serving_engines
from draftsmith.runtime.errors import UserError, one_line
from draftsmith.runtime.files import read_json, write_json

from .depth_check import depth_check, replayed_schedules
from .engine_report import build_report, markdown, plot_curves
from .load_curves import Level, curves, documents_text, long_prompts
from .plain_cache import plain_cache_file, target_fingerprint
from .run_files import check_outputs, keep_logs
from .settings import EngineEvalArgs, parse_engine_eval_args
from .settings import build_parser as build_settings_parser
from .setup import EngineEnv, require_env
from .vllm_engine import VllmRun, run_worker, speculative_config, speed_settings

CHECKED = {"within_tolerance": True}  # a run without --depths has no depth check to fail
MAX_MODEL_LEN_MARGIN = 16  # vLLM's context: the longest prompt + max new tokens + the draft depth, and some


def served_kind(drafter: str, target: Any) -> str:
    """The drafter's kind when vLLM serves it beside `target`; otherwise one line saying why not."""
    if drafter == "ngram":
        return "ngram"
    config_file = Path(drafter).expanduser() / "config.json"
    meta_file = Path(drafter).expanduser() / "draftsmith.json"
    if meta_file.is_file():
        return "draft_lm"
    config = read_json(config_file) if config_file.is_file() else {}
    if "kind" not in config:
        raise UserError(
            f"--drafter {drafter!r}: pass ngram or a draftsmith checkpoint (a training run's final/)"
        )
    kind = config["kind"]
    record = family(kind)
    if not record.serves("vllm"):
        raise UserError(
            f"vLLM does not serve {kind} drafters: {record.why_not.get('vllm', 'no vLLM layout')}"
        )
    layer = str(config.get("drafter", {}).get("layer", "llama"))
    if "vllm" not in serving_engines(kind, target.model.config, layer):
        raise UserError(f"vLLM does not serve this {kind} drafter: {record.serving_note}")
    if (
        record.served_target is not None
        and record.resolve("served_target")(target, Path(drafter)) is not None
    ):
        raise UserError(
            f"this {kind} drafter changes the target (an adapter merged into it); engine-eval serves the "
            "target as it is: evaluate it with `draftsmith eval`"
        )
    return kind


def job(
    args: EngineEvalArgs,
    prompts: list[list[int]],
    stop_ids: list[int],
    spec: Any,
    max_positions: int | None,
) -> dict[str, Any]:
    """What the worker (or the server) is given: the model, the prompts and sampling, `spec` or None."""
    longest = max(len(p) for p in prompts)
    depth = (spec or {}).get("num_speculative_tokens", 0)
    length = longest + args.max_new_tokens + depth + MAX_MODEL_LEN_MARGIN
    return {
        "model": str(Path(args.target).expanduser().resolve()),
        "dtype": "float32",  # bfloat16 on the CPU is not batch-invariant: outputs would not be comparable
        "max_model_len": min(length, max_positions) if max_positions else length,
        "seed": args.seed,
        "enforce_eager": args.enforce_eager,
        "trust_remote_code": args.trust_remote_code,
        # vLLM pads a request whose prompt is cached up to its last token to a decoding step with K placeholder
        # drafts, and counts that step as a draft with none accepted: off, every counted draft is the drafter's
        "enable_prefix_caching": False,
        "speculative_config": spec,
        "prompts": prompts,
        "max_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "stop_token_ids": stop_ids,
        "seeds": [args.seed * 1_000_003 + i for i in range(len(prompts))],
        "batch_size": args.batch_size,
    }


def say(args: EngineEvalArgs, text: str) -> None:
    """A progress line (none under --no-progress)."""
    if args.progress:
        print(text, flush=True)


def evaluator_settings(args: EngineEvalArgs) -> EvalArgs:
    """The evaluator's settings for the same decoding, following vLLM's rules where the two may differ."""
    return EvalArgs(
        target=args.target,
        drafter=args.drafter,
        data=args.data,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        depth=max(args.depth or 0, *args.depths) if args.depths else args.depth,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        draft_sample_method=args.draft_sample_method,
        check_lossless=args.temperature == 0,
        dtype="float32",
        trust_remote_code=args.trust_remote_code,
        ngram_min=args.ngram_min,
        ngram_max=args.ngram_max,
        ngram_match="earliest",  # vLLM's proposer continues the earliest occurrence of the longest match
        drafts_at_budget="full",  # vLLM schedules no partial drafts: full depth at max_tokens, all counted
        progress=args.progress,
    )


def export_drafter(args: EngineEvalArgs, work: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """The drafter in vLLM's layout under `work` and its export record; nothing for ngram (vLLM's own
    proposer)."""
    # ship.export imports torch: here rather than at the top, so `engine-eval --help` stays fast
    from draftsmith.ship.export import export

    if args.drafter == "ngram":
        return None, None
    export_dir = work / "export-vllm"
    export(args.drafter, "vllm", export_dir, args.target)
    return export_dir, read_json(export_dir / "draftsmith_export.json")


def plain_run(
    args: EngineEvalArgs, engine: EngineEnv, plain_job: dict[str, Any], work: Path, target: Any
) -> VllmRun:
    """vLLM's plain decoding of the job: reused from --plain-cache when an identical job on a target with the
    same content is kept there, else run (and kept there when --plain-cache is given)."""
    cached = None
    if args.plain_cache:
        fingerprint = target_fingerprint(target, Path(plain_job["model"]))
        runner = {"python": str(engine.python), **speed_settings(engine)}
        cached = plain_cache_file(args.plain_cache, plain_job, runner, fingerprint)
    if cached is not None and cached.is_file():
        say(args, f"vLLM: plain decoding of the same job, reused from {cached}")
        return VllmRun(**read_json(cached))
    count = len(plain_job["prompts"])
    say(args, f"vLLM: plain decoding of {count} answers (log: {work / 'vllm-plain.log'})")
    plain = run_worker(engine, plain_job, work / "vllm-plain.log")
    if cached is not None:
        write_json(cached, asdict(plain))
    return plain


def evaluate(args: EngineEvalArgs, work: Path) -> dict[str, Any]:
    """The evaluator's figures and vLLM's (plain and speculative) on the same prompt ids, as the report; with
    the load curves when --concurrency or --context-lengths asks for them. Every option is checked before the
    evaluator decodes: the engine, the drafter, the long prompts."""
    # these import torch: here rather than at the top, so `engine-eval --help` stays fast
    from draftsmith.eval.acceptance import evaluate as draftsmith_evaluate
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids

    engine = require_env(args.engine, args.venv)  # before any decoding: a missing engine is one line
    config = TargetConfig(path=args.target, dtype="float32", trust_remote_code=args.trust_remote_code)
    target = FrozenTarget.load(config)
    kind = served_kind(args.drafter, target)
    long = context_levels(args, target)
    export_dir, info = export_drafter(args, work)
    turns: list[Any] = []
    ours = draftsmith_evaluate(evaluator_settings(args), target=target, record=turns)
    depth = int(ours["settings"]["depth"])
    ngram = (args.ngram_min, args.ngram_max) if args.drafter == "ngram" else None
    spec = speculative_config(info, export_dir, depth, args.draft_sample_method, ngram)
    prompts = [t.prompt for t in turns]
    stops = sorted(stop_token_ids(target))
    max_positions = getattr(target.model.config, "max_position_embeddings", None)
    plain = plain_run(args, engine, job(args, prompts, stops, None, max_positions), work, target)
    say(args, f"vLLM: speculative decoding, {json.dumps(spec)}")
    spec_run = run_worker(
        engine, job(args, prompts, stops, spec, max_positions), work / "vllm-speculative.log"
    )
    report = build_report(
        args, kind, ours, turns, plain, spec_run, spec, engine.spec.package, speed_settings(engine)
    )
    if args.depths:
        runs = {depth: spec_run}
        for k in (k for k in args.depths if k != depth):
            spec_k = speculative_config(info, export_dir, k, args.draft_sample_method, ngram)
            say(args, f"vLLM: speculative decoding at depth {k} (--depths)")
            runs[k] = run_worker(
                engine, job(args, prompts, stops, spec_k, max_positions), work / f"vllm-depth-{k}.log"
            )
        report["depth_check"] = depth_check(
            ours, plain, runs, depth, args.max_speedup_diff, replayed_schedules(args, prompts, plain.outputs)
        )
        if report["lossless"] is not None:  # at T = 0 every depth's answers must equal the plain ones
            rows = report["depth_check"]["rows"]
            report["lossless"] = report["lossless"] and all(
                r["speculative_equals_plain"] == len(prompts) for r in rows
            )
    levels = [Level("concurrency", c, prompts, c) for c in args.concurrency] + long
    if levels:
        every = [p for level in levels for p in level.prompts]
        report["curves"] = curves(
            engine,
            job(args, every, stops, None, max_positions),
            job(args, every, stops, spec, max_positions),
            levels,
            work,
            args.progress,
        )
    return report


def context_levels(args: EngineEvalArgs, target: Any) -> list[Level]:
    """The levels `--context-lengths` asks for (long prompts cut from --context-data), built right after the
    target loads: a length past its positions or documents without text is one line before anything runs."""
    if not args.context_lengths:
        return []
    limit = getattr(target.model.config, "max_position_embeddings", None)
    for length in args.context_lengths:
        if limit is not None and length + args.max_new_tokens + MAX_MODEL_LEN_MARGIN > limit:
            raise UserError(
                f"--context-lengths {length}: with --max-new-tokens {args.max_new_tokens} it passes the "
                f"target's {limit} positions"
            )
    source = args.context_data or args.data
    docs = documents_text(source)
    if not docs:
        raise UserError(f"--context-data {source}: no text to build long prompts from")
    return [
        Level("context_tokens", n, long_prompts(target.tokenizer, docs, n, args.context_prompts), 1)
        for n in args.context_lengths
    ]


def measure(args: EngineEvalArgs) -> dict[str, Any]:
    """The report, with the export and vLLM's logs in --work-dir (kept) or a temporary directory; when a run
    in the temporary directory fails, its logs are kept (`keep_logs`) and the error names the copies."""
    if args.work_dir:
        work = Path(args.work_dir).expanduser()
        work.mkdir(parents=True, exist_ok=True)
        return evaluate(args, work)
    with tempfile.TemporaryDirectory(prefix="draftsmith-engine-eval-") as tmp:
        try:
            return evaluate(args, Path(tmp))
        except Exception as err:
            kept = keep_logs(Path(tmp))
            if kept is None:
                raise
            message = one_line(err)
            if message is None:  # a bug keeps its traceback; the logs are kept all the same
                print(f"vLLM's logs: {kept}", file=sys.stderr)
                raise
            named = message.replace(tmp, str(kept))
            raise UserError(named if named != message else f"{message} (vLLM's logs: {kept})") from None


def build_parser() -> argparse.ArgumentParser:
    return build_settings_parser(__doc__ or "")


def draw(report: dict[str, Any], args: EngineEvalArgs) -> None:
    """The --plot PNG, after the report is written: a failure is one line saying where the report is."""
    assert args.plot is not None
    try:
        plot_curves(report, Path(args.plot))
    except Exception as err:  # the plot is optional: whatever failed, the measurement is kept
        why = one_line(err) or f"{type(err).__name__}: {err}"
        kept = f"the report is in {args.report}" if args.report else "the comparison is above"
        raise UserError(f"--plot {args.plot}: the plot was not drawn ({why}); {kept}") from None
    print(f"plot: {args.plot}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_engine_eval_args(build_parser(), argv)
    check_outputs(args)
    report = measure(args)
    print(markdown(report))
    if args.report:  # the measurement first: an optional plot that fails must not lose it
        write_json(Path(args.report), report)
        print(f"report: {args.report}")
    if args.plot:
        draw(report, args)
    failures = [
        why
        for why, failed in (
            ("tau differs", not report["tau_agrees"]),
            ("not lossless", report["lossless"] is False),
            (
                "the depth prediction misses vLLM's speedup",
                not report.get("depth_check", CHECKED)["within_tolerance"],
            ),
        )
        if failed
    ]
    if failures:
        print("engine-eval failed: " + "; ".join(failures), file=sys.stderr)
        return FAIL
    return 0
