"""`draftsmith engine-eval`: the engine users serve with measures the same drafter on the same prompts.

    draftsmith engine-eval --engine vllm --target DIR --drafter CKPT|ngram --data FILE
        [--num-prompts N] [--max-new-tokens M] [--depth K] [--temperature X]
        [--draft-sample-method greedy|probabilistic] [--batch-size B] [--report R] [--max-rel-diff 0.03]
        [--plain-cache DIR] [--concurrency 1,2,4,8] [--context-lengths 512,2048] [--plot P]

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
max_tokens; the answers are cut at the budget either way). The exit status is 3 when the difference is above
--max-rel-diff (at T > 0, where the engines sample different answers, above 3 standard errors of the difference
if that is more) or a lossless check failed.

A drafter family vLLM does not serve (for this target) is refused before anything runs, naming why.

`--concurrency` and `--context-lengths` then measure where speculation stops paying: vLLM's own server with and
without the drafter, requests in flight or long prompts (engines/load_curves.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftsmith.eval.gate import FAIL
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import read_json

from .engine_report import build_report, markdown, plot_curves
from .load_curves import Level, curves, documents_text, long_prompts
from .setup import ENGINES, require_env
from .vllm_engine import VllmRun, run_worker, speculative_config

MAX_MODEL_LEN_MARGIN = 16  # vLLM's context: the longest prompt + max new tokens + the draft depth, and some


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith engine-eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engine", choices=ENGINES, default="vllm", help="the serving engine (default vllm)")
    p.add_argument("--target", required=True, help="the target model directory (or .gguf file)")
    p.add_argument("--drafter", required=True, help="a draftsmith checkpoint (a run's final/) or ngram")
    p.add_argument("--data", required=True, help="prompts, in any format `draftsmith eval` reads")
    p.add_argument("--num-prompts", type=int, default=20, help="items to decode (default 20; 0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per answer (default 128)")
    p.add_argument("--depth", type=int, default=None, help="draft tokens per step (default: the evaluator's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument(
        "--draft-sample-method",
        choices=("greedy", "probabilistic"),
        default="greedy",
        help="at T > 0, as vLLM's option: greedy = argmax drafts accepted with the target's probability; "
        "probabilistic = drafts sampled from the drafter, accepted with min(1, p/q)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="requests vLLM decodes together (default 1); the evaluator decodes one at a time, and its tau does "
        "not depend on the batch",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ngram-min", type=int, default=1, help="ngram drafter: shortest n-gram matched")
    p.add_argument("--ngram-max", type=int, default=3, help="ngram drafter: longest n-gram matched")
    p.add_argument("--venv", default=None, help="the engine's venv (default: where engine-setup puts it)")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start)")
    p.add_argument(
        "--max-rel-diff",
        type=float,
        default=0.03,
        help="fail (exit 3) when |tau_vllm - tau_draftsmith| / tau_draftsmith is above this (default 0.03); at T > 0, "
        "where the engines sample different answers, above this or 3 standard errors of the difference",
    )
    p.add_argument("--work-dir", default=None, help="keep the export and vLLM's logs here (default: temp)")
    p.add_argument(
        "--plain-cache",
        default=None,
        help="keep vLLM's plain runs here and reuse one whose job (model, prompt ids, sampling, batch) is "
        "identical: several drafters compared on the same prompts decode them plainly once",
    )
    p.add_argument(
        "--concurrency",
        default=None,
        help="also measure vLLM's server with and without the drafter at these requests in flight, e.g. 1,2,4,8: "
        "tokens/s, speedup, and the concurrency from which speculation stops paying (engines/load_curves.py)",
    )
    p.add_argument(
        "--context-lengths",
        default=None,
        help="the same over prompt lengths in tokens, e.g. 512,2048,8192, one request at a time; the prompts are "
        "real documents cut to length (--context-data)",
    )
    p.add_argument(
        "--context-data",
        default=None,
        help="documents for --context-lengths (default: --data), any data format",
    )
    p.add_argument("--context-prompts", type=int, default=4, help="prompts per context length (default 4)")
    p.add_argument(
        "--plot", default=None, help="a PNG of the speedup curves (--concurrency, --context-lengths)"
    )
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def served_kind(drafter: str, target: Any) -> str:
    """The drafter's kind when vLLM serves it beside `target`; otherwise one line saying why not."""
    from draftsmith.models.families import family
    from draftsmith.models.serving import serving_engines

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
    args: argparse.Namespace,
    prompts: list[list[int]],
    stop_ids: list[int],
    spec: Any,
    max_positions: int | None,
) -> dict[str, Any]:
    longest = max(len(p) for p in prompts)
    depth = (spec or {}).get("num_speculative_tokens", 0)
    length = longest + args.max_new_tokens + depth + MAX_MODEL_LEN_MARGIN
    return {
        "model": str(Path(args.target).expanduser().resolve()),
        "dtype": "float32",  # bfloat16 on the CPU is not batch-invariant: outputs would not be comparable
        "max_model_len": min(length, max_positions) if max_positions else length,
        "seed": args.seed,
        "enforce_eager": args.enforce_eager,
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


def plain_cache_file(folder: str, plain_job: dict[str, Any], engine: str) -> Path:
    """Where a plain run of exactly this job is kept: named by the sha256 of the job and the engine (its venv's
    python)."""
    key = hashlib.sha256(json.dumps([plain_job, engine], sort_keys=True).encode()).hexdigest()[:20]
    return Path(folder).expanduser() / f"vllm-plain-{key}.json"


def evaluate(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from draftsmith.eval.acceptance import evaluate as draftsmith_evaluate
    from draftsmith.eval.acceptance import write_json
    from draftsmith.eval.settings import EvalArgs
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
    from draftsmith.ship.export import export

    if args.temperature < 0 or args.num_prompts < 0 or args.max_new_tokens < 1 or args.batch_size < 1:
        raise UserError(
            "--temperature and --num-prompts must be >= 0, --max-new-tokens and --batch-size >= 1"
        )
    if Path(args.target).suffix == ".gguf":
        raise UserError(
            "--target: engine-eval serves a model directory; write the GGUF as one first (draftsmith build-target "
            "--preset ... --out DIR, or any directory with config.json and safetensors)"
        )
    int_list(args.concurrency, "--concurrency"), int_list(args.context_lengths, "--context-lengths")
    if args.plot and not (args.concurrency or args.context_lengths):
        raise UserError("--plot draws the curves of --concurrency or --context-lengths: pass one of them")
    if args.context_prompts < 1:
        raise UserError("--context-prompts must be >= 1")
    engine = require_env(args.engine, args.venv)  # before any decoding: a missing engine is one line
    target = FrozenTarget.load(TargetConfig(path=args.target, dtype="float32"))
    kind = served_kind(args.drafter, target)
    prompt_lookup = args.drafter == "ngram"  # the engine's own proposer: nothing to export
    export_dir, info = None, None
    if not prompt_lookup:
        export_dir = work / "export-vllm"
        export(args.drafter, "vllm", export_dir, args.target)
        info = read_json(export_dir / "draftsmith_export.json")
    turns: list[Any] = []
    ours = draftsmith_evaluate(
        EvalArgs(
            target=args.target,
            drafter=args.drafter,
            data=args.data,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            depth=args.depth,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            draft_sample_method=args.draft_sample_method,
            check_lossless=args.temperature == 0,
            dtype="float32",
            ngram_min=args.ngram_min,
            ngram_max=args.ngram_max,
            ngram_match="earliest",  # vLLM's proposer continues the earliest occurrence of the longest match
            drafts_at_budget="full",  # vLLM schedules no partial drafts: full depth at max_tokens, all counted
            progress=args.progress,
        ),
        target=target,
        record=turns,
    )
    depth = int(ours["settings"]["depth"])
    ngram = (args.ngram_min, args.ngram_max) if prompt_lookup else None
    spec = speculative_config(info, export_dir, depth, args.draft_sample_method, ngram)
    prompts = [t.prompt for t in turns]
    stops = sorted(stop_token_ids(target))
    max_positions = getattr(target.model.config, "max_position_embeddings", None)
    say = print if args.progress else (lambda *a, **k: None)
    plain_job = job(args, prompts, stops, None, max_positions)
    cached = plain_cache_file(args.plain_cache, plain_job, str(engine.python)) if args.plain_cache else None
    if cached is not None and cached.is_file():
        say(f"vLLM: plain decoding of the same job, reused from {cached}", flush=True)
        plain = VllmRun(**read_json(cached))
    else:
        say(f"vLLM: plain decoding of {len(prompts)} answers (log: {work / 'vllm-plain.log'})", flush=True)
        plain = run_worker(engine, plain_job, work / "vllm-plain.log")
        if cached is not None:
            write_json(cached, asdict(plain))
    say(f"vLLM: speculative decoding, {json.dumps(spec)}", flush=True)
    spec_run = run_worker(
        engine, job(args, prompts, stops, spec, max_positions), work / "vllm-speculative.log"
    )
    report = build_report(args, kind, ours, turns, plain, spec_run, spec, engine.spec.package)
    levels = load_levels(args, target, prompts)
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


def int_list(text: str | None, flag: str) -> list[int]:
    if not text:
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if any(v < 1 for v in values):
        raise UserError(f"{flag} {text!r}: every value must be >= 1")
    return sorted(set(values))


def load_levels(args: argparse.Namespace, target: Any, prompts: list[list[int]]) -> list[Level]:
    """The levels `--concurrency` and `--context-lengths` ask for (empty: no curves)."""
    levels = [Level("concurrency", c, prompts, c) for c in int_list(args.concurrency, "--concurrency")]
    lengths = int_list(args.context_lengths, "--context-lengths")
    if lengths:
        docs = documents_text(args.context_data or args.data)
        if not docs:
            raise UserError(
                f"--context-data {args.context_data or args.data}: no text to build long prompts from"
            )
        limit = getattr(target.model.config, "max_position_embeddings", None)
        for length in lengths:
            if limit is not None and length + args.max_new_tokens + MAX_MODEL_LEN_MARGIN > limit:
                raise UserError(
                    f"--context-lengths {length}: with --max-new-tokens {args.max_new_tokens} it passes the "
                    f"target's {limit} positions"
                )
            levels.append(
                Level(
                    "context_tokens",
                    length,
                    long_prompts(target.tokenizer, docs, length, args.context_prompts),
                    1,
                )
            )
    return levels


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.work_dir:
        work = Path(args.work_dir).expanduser()
        work.mkdir(parents=True, exist_ok=True)
        report = evaluate(args, work)
    else:
        with tempfile.TemporaryDirectory(prefix="draftsmith-engine-eval-") as tmp:
            report = evaluate(args, Path(tmp))
    report["settings"]["max_rel_diff"] = args.max_rel_diff
    print(markdown(report))
    if args.plot:
        plot_curves(report, Path(args.plot))
        print(f"plot: {args.plot}")
    if args.report:
        from draftsmith.eval.acceptance import write_json

        write_json(Path(args.report), report)
        print(f"report: {args.report}")
    if not report["tau_agrees"] or report["lossless"] is False:
        print(
            "engine-eval failed: " + ("tau differs" if not report["tau_agrees"] else "not lossless"),
            file=sys.stderr,
        )
        return FAIL
    return 0
