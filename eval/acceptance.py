"""Measure a drafter by real speculative decoding against the real target on held-out prompts.

    draftsmith eval --target DIR_OR_HUB_ID --drafter CKPT|ngram|self|HF_DIR --data FILE [options]
    python eval/acceptance.py ...   (the same)

Each conversation's prompt is everything up to its last user turn, rendered with the target's chat template
and generation prompt. Multi-turn items (MT-bench) run every turn, each conditioned on the model's own
earlier answers. Prints a Markdown table; writes a JSON report (--report), a bar plot of acceptance by depth
(--plot) and, with --save-eval, the report as eval.json in the drafter checkpoint. --min-tau X is the
deployment gate (eval/gate.py): exit status 3 when tau < X or the lossless check failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python eval/acceptance.py`: eval/'s own files must not shadow modules
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from draftsmith.eval.gate import FAIL, gate  # noqa: E402
from draftsmith.eval.kv_cache import KV_CACHES  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class EvalArgs:
    target: str
    drafter: str
    data: str
    format: str = "auto"
    num_prompts: int = 20
    max_new_tokens: int = 128
    depth: int | None = None
    tree: str = "chain"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    acceptance: str = "exact"
    baseline: bool = True
    check_lossless: bool = False
    device: str = "auto"
    dtype: str = "auto"
    kv_cache: str = "auto"
    ngram_max: int = 3
    ngram_min: int = 1
    progress: bool = True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", required=True, help="target model: local directory or Hugging Face Hub id")
    p.add_argument(
        "--drafter",
        required=True,
        help="ngram (prompt lookup), self (the target drafts for itself: a sanity check), a draftsmith "
        "checkpoint directory (a run's final/), or a Hugging Face causal LM sharing the target's tokenizer",
    )
    p.add_argument(
        "--data",
        required=True,
        help="prompts: a .jsonl/.json/.parquet file in any format of the data pipeline (messages, sharegpt, "
        "alpaca, turns, pair), a save_to_disk directory, hf:owner/name[:split] or stdlib:heldout",
    )
    p.add_argument("--format", default="auto", help="data format (default: detected from the first record)")
    p.add_argument("--num-prompts", type=int, default=20, help="items to evaluate (default 20; 0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per answer (default 128)")
    p.add_argument(
        "--depth",
        type=int,
        default=None,
        help="draft depth K (default 5, or the drafter's maximum if smaller)",
    )
    p.add_argument(
        "--tree",
        default="chain",
        help="draft tree: chain, topk:K (K alternatives per depth), sample:K (K sampled alternatives, LM "
        "drafters at T>0), paths:FILE (JSON list of rank paths, Medusa style), or dynamic:K:N (EAGLE-2 "
        "dynamic tree of N drafts, EAGLE drafters). Default chain",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); >0 = sampling")
    p.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling, applied to target and draft alike"
    )
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling (0 = off), applied to both alike")
    p.add_argument(
        "--seed", type=int, default=0, help="sampling seed (each answer gets seed-derived streams)"
    )
    p.add_argument(
        "--acceptance",
        choices=["exact", "typical"],
        default="exact",
        help="exact = lossless verification (default); typical = Medusa's typical acceptance (LOSSY)",
    )
    p.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip plain decoding (no speedup)"
    )
    p.add_argument(
        "--check-lossless",
        action="store_true",
        help="at T=0, check that every answer equals plain greedy decoding token for token",
    )
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--plot", type=Path, help="write a PNG bar plot of acceptance by depth here")
    p.add_argument("--save-eval", action="store_true", help="write the report as eval.json in the checkpoint")
    p.add_argument("--min-tau", type=float, help="deployment gate: exit with status 3 when tau < this")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--kv-cache",
        default="auto",
        choices=list(KV_CACHES),
        help="the target's key/value cache: auto (the model's dtype) or fp8 (float8 e4m3 with a per-tensor "
        "scale, as vLLM's --kv-cache-dtype fp8; the plain-decoding baseline uses it too)",
    )
    p.add_argument("--ngram-max", type=int, default=3, help="longest n-gram the ngram drafter matches")
    p.add_argument("--ngram-min", type=int, default=1, help="shortest n-gram the ngram drafter matches")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def _versions(device: torch.device) -> dict[str, Any]:
    import transformers

    from draftsmith.models.checkpoint import draftsmith_version

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


def evaluate(args: EvalArgs, target: Any = None, drafter: Any = None) -> dict[str, Any]:
    """Run the evaluation `args` describes and return the report (see eval/report.py for the metrics).

    `target` / `drafter` may be passed pre-loaded (tests, benchmarks); otherwise they are loaded from args.
    """
    from tqdm.auto import tqdm

    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations, with_answers
    from draftsmith.eval.decoder import SpeculativeDecoder, plain_decode
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.drift import adapted_target, adapter_dir, adapter_drift
    from draftsmith.eval.report import TurnResult, per_prompt_rows, summarize
    from draftsmith.eval.sampling import Sampling
    from draftsmith.eval.tree import parse_tree
    from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids

    sampling = Sampling(args.temperature, args.top_p, args.top_k)
    if args.check_lossless and not sampling.greedy:
        raise ValueError("--check-lossless compares with greedy decoding: it needs --temperature 0")
    if args.check_lossless and not args.baseline:
        raise ValueError("--check-lossless needs the plain-decoding baseline: drop --no-baseline")
    if args.num_prompts < 0 or args.max_new_tokens < 1:
        raise ValueError("--num-prompts must be >= 0 and --max-new-tokens >= 1")
    parse_tree(args.tree, args.depth if args.depth is not None else 1)  # a bad --tree fails before loading
    convs = read_conversations(args.data, args.format)
    convs = [c for c in convs if prompt_turns(c)]
    if not convs:
        raise ValueError(f"--data {args.data}: no conversation with a user turn to use as a prompt")
    if args.num_prompts:
        if args.num_prompts > len(convs):
            logger.warning(
                "--num-prompts %d: %s has only %d usable conversations; evaluating those",
                args.num_prompts, args.data, len(convs),
            )  # fmt: skip
        convs = convs[: args.num_prompts]
    if target is None:
        device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        )
        target = FrozenTarget.load(TargetConfig(path=args.target, dtype=args.dtype), device)
    adapter = adapter_dir(args.drafter)
    original = None
    if adapter is not None:  # Medusa-2: the adapted target is what gets served
        original, target = target, adapted_target(target, adapter)
    if drafter is None:
        drafter = load_drafter_spec(args.drafter, target, args.ngram_max, args.ngram_min)
    depth = args.depth if args.depth is not None else min(5, drafter.max_depth or 5)
    shape = parse_tree(args.tree, depth)
    decoder = SpeculativeDecoder(target, drafter, shape, sampling, args.acceptance, args.kv_cache)
    max_pos = getattr(target.model.config, "max_position_embeddings", None)
    if max_pos is not None and args.max_new_tokens >= max_pos:
        raise ValueError(
            f"--max-new-tokens must be in 1..{max_pos - 1}: the target's context holds {max_pos} positions, "
            "prompt included"
        )
    stop_ids = stop_token_ids(target)
    device = target.device

    def generator(index: int, turn: int) -> torch.Generator:
        return torch.Generator(device).manual_seed(args.seed * 1_000_003 + index * 101 + turn)

    # Warm-up (not measured): allocator, kernels and lazy imports would otherwise bill the first prompt.
    warm = render_prompt(target.tokenizer, prompt_turns(convs[0])[0], convs[0].tools)[-64:]
    decoder.generate(warm, 8, generator(-1, 0))
    plain_decode(target, warm, 8, sampling, generator(-1, 0), stop_ids, args.kv_cache)

    turns: list[TurnResult] = []
    skipped: list[str] = []
    bar = tqdm(convs, desc="eval", unit="prompt", disable=not args.progress)
    for index, conv in enumerate(bar):
        item = conv.id or conv.source
        answers: list[str] = []
        for k, prompt_msgs in enumerate(prompt_turns(conv)):
            prompt = render_prompt(target.tokenizer, with_answers(prompt_msgs, answers), conv.tools)
            if max_pos is not None and len(prompt) + args.max_new_tokens > max_pos:
                skipped.append(
                    f"{item} turn {k}: {len(prompt)} prompt tokens + {args.max_new_tokens} > {max_pos}"
                )
                break
            spec = decoder.generate(prompt, args.max_new_tokens, generator(index, k))
            base = (
                plain_decode(
                    target, prompt, args.max_new_tokens, sampling, generator(index, k), stop_ids, args.kv_cache
                )
                if args.baseline
                else None
            )
            turns.append(TurnResult(item, k, len(prompt), spec, base))
            text_ids = [t for t in spec.tokens if t not in stop_ids]
            answers.append(target.tokenizer.decode(text_ids, skip_special_tokens=True))
        running = summarize(turns)["tau"] if turns else None
        bar.set_postfix(tau=f"{running:.3f}" if running else "-")
    if skipped:
        logger.warning(
            "skipped %d turns longer than the target's context: %s", len(skipped), "; ".join(skipped[:3])
        )
    if not turns:
        raise ValueError("every prompt was longer than the target's context window; lower --max-new-tokens")

    report = summarize(turns)
    if original is not None:
        firsts = [render_prompt(target.tokenizer, prompt_turns(c)[0], c.tools) for c in convs]
        report["adapter_drift"] = adapter_drift(
            original, target, [p for p in firsts if max_pos is None or len(p) + args.max_new_tokens <= max_pos],
            args.max_new_tokens,
        )  # fmt: skip
    rows = per_prompt_rows(turns)
    lossless = None
    if args.check_lossless:
        for row, t in zip(rows, turns, strict=True):
            row["matches_greedy"] = t.baseline is not None and t.spec.tokens == t.baseline.tokens
        lossless = all(r["matches_greedy"] for r in rows)
    settings = {
        **{k: v for k, v in asdict(args).items() if k != "progress"},
        "depth": depth,
        "max_draft_tokens": shape.num_draft,
        "drafter_kind": getattr(drafter, "name", type(drafter).__name__),
        "target_identity": target.identity(),
        "versions": _versions(device),
    }
    report.update(
        {
            "num_prompts": len({t.item for t in turns}),
            "num_turns": len(turns),
            "skipped_turns": skipped,
            "lossless": lossless,
            "settings": settings,
            "per_prompt": rows,
        }
    )
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    """Write atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


def run(args: argparse.Namespace) -> int:
    from draftsmith.eval.report import markdown, plot_acceptance

    if args.save_eval and not (Path(args.drafter) / "config.json").is_file():
        raise ValueError("--save-eval writes eval.json into a draftsmith checkpoint; --drafter is not one")
    fields = EvalArgs.__dataclass_fields__
    report = evaluate(EvalArgs(**{k: v for k, v in vars(args).items() if k in fields}))
    print(markdown(report))
    if report["lossless"] is False:
        bad = [f"{r['id']} turn {r['turn']}" for r in report["per_prompt"] if not r["matches_greedy"]]
        print(f"LOSSLESS CHECK FAILED: {len(bad)} answers differ from greedy decoding: {', '.join(bad[:5])}")
    if args.report:
        write_json(report, args.report)
        print(f"report: {args.report}")
    if args.plot:
        plot_acceptance(report, args.plot)
        print(f"plot: {args.plot}")
    if args.save_eval:
        write_json(report, Path(args.drafter) / "eval.json")
        print(f"report saved in the checkpoint: {Path(args.drafter) / 'eval.json'}")
    if args.min_tau is not None:  # the deployment gate: the same rule as `draftsmith gate --min-tau`
        passed, reason = gate(report, None, args.min_tau, max_drop=0.0)
        if not passed:
            print(f"gate failed: {reason} (drafter {args.drafter})", file=sys.stderr)
            return FAIL
    if report["lossless"] is False:
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from draftsmith.models.errors import run_main

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return run_main(lambda _: run(args), [])


if __name__ == "__main__":
    sys.exit(main())
