"""Benchmarks of the speculative evaluator (docs/BENCHMARKS.md, "Speculative evaluator").

    python -m bench.bench_eval matrix   --target DIR --medusa CKPT --out DIR
    python -m bench.bench_eval overhead --target DIR --medusa CKPT --out DIR
    python -m bench.bench_eval assisted --target DIR --draft DIR --out DIR
    python -m bench.bench_eval eagle    --target DIR --medusa CKPT --eagle1 CKPT --eagle3 CKPT --out DIR
    python -m bench.bench_eval tables --out DIR      (Markdown tables of the three)

matrix: tau and speedup for ngram, Medusa-1 and a 1-layer draft_lm (--draft: the `small-draft1` toy preset, a
  1-layer LM trained on the same corpus with the same tokenizer) on held-out
  standard-library prompts and on ../shared/data/eagle_eval_sets (8 prompts from each of its 5 files), at
  T=0 and T=1, depth 3 and 5, chain and topk:3 tree.
overhead: the evaluator's mean time per verification step (target forward, verification, cache compaction,
  drafter bookkeeping; drafting excluded) divided by the mean time of a bare `model(ids, cache=...)`
  over the same number of tokens with the same cache length, for a sample of the steps actually taken.
assisted: tokens/s of draft_lm speculative decoding vs transformers' assisted generation
  (`generate(assistant_model=...)`, constant schedule, confidence stop off) with the same draft and K, and
  vs plain greedy decoding, same prompts, same process, T=0; for the trained 1-layer draft (--draft) and
  for the "copied-layer" draft of transformers' assisted-generation demos (the target's first layer,
  embeddings, norm and head, untrained).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from draftsmith.runtime.display import table as md_table

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
EAGLE_FILES = ["alpaca", "gsm8k", "humaneval", "qa", "sum"]


def _load(target_dir: str) -> Any:
    from draftsmith.models.target import FrozenTarget, TargetConfig

    return FrozenTarget.load(TargetConfig(path=target_dir))


def _heldout_prompts(target: Any, n: int) -> list[list[int]]:
    """The first `n` held-out standard-library conversations, rendered up to their user turn."""
    from draftsmith.data.chat_render import render_prompt
    from draftsmith.data.conversations import prompt_turns, read_conversations

    return [
        render_prompt(target.tokenizer, prompt_turns(c)[-1])
        for c in read_conversations("stdlib:heldout", limit=n)
    ]


def draft_lm_dir(target: Any, out: Path) -> Path:
    """Save the 1-layer copied draft of `target` (with its tokenizer) under `out` once."""
    from draftsmith.models.draft_lm import draft_from_target

    path = out / "draft_lm-copied-1layer"
    if not (path / "config.json").is_file():
        draft_from_target(target.model, 1).save_pretrained(path)
        target.tokenizer.save_pretrained(path)
    return path


def eagle_mix(out: Path, per_file: int = 8) -> Path:
    """The first `per_file` questions of each eagle_eval_sets file, as one JSONL (written outside the repo)."""
    path = out / f"eagle_eval_sets_{per_file}x{len(EAGLE_FILES)}.jsonl"
    lines = []
    for name in EAGLE_FILES:
        with open(SHARED / "eagle_eval_sets" / f"{name}.question.jsonl") as f:
            lines += [next(f).strip() for _ in range(per_file)]
    path.write_text("\n".join(lines) + "\n")
    return path


def matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec

    target = _load(args.target)
    drafters = {
        "ngram": "ngram",
        "medusa-1": args.medusa,
        "draft_lm-1layer": args.draft,
    }
    datasets = {"stdlib:heldout": "stdlib:heldout", "eagle_eval_sets": str(eagle_mix(args.out))}
    if args.drafters:
        drafters = {k: v for k, v in drafters.items() if k in args.drafters.split(",")}
    rows = []
    for data_name, data in datasets.items():
        for drafter_name, spec in drafters.items():
            drafter = load_drafter_spec(spec, target)
            for temperature in (0.0, 1.0):
                for depth in (3, 5):
                    for tree in ("chain", "topk:3"):
                        r = evaluate(
                            EvalArgs(
                                target=args.target,
                                drafter=spec,
                                data=data,
                                num_prompts=args.num_prompts,
                                max_new_tokens=args.max_new_tokens,
                                depth=depth,
                                tree=tree,
                                temperature=temperature,
                                check_lossless=temperature == 0,
                                progress=False,
                            ),
                            target,
                            drafter,
                        )
                        row = {
                            "data": data_name,
                            "drafter": drafter_name,
                            "T": temperature,
                            "depth": depth,
                            "tree": tree,
                            "tau": r["tau"],
                            "alpha": r["alpha"],
                            "speedup": r["speedup"],
                            "tokens_per_s": r["tokens_per_s"],
                            "baseline_tokens_per_s": r["baseline_tokens_per_s"],
                            "lossless": r["lossless"],
                            "turns": r["num_turns"],
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    return rows


def eagle(args: argparse.Namespace) -> list[dict[str, Any]]:
    """tau at T=0 / T=1, depth 5, chain and tree (EAGLE: the EAGLE-2 dynamic tree dynamic:4:16; others
    their static topk:3 tree), for ngram, Medusa-1, EAGLE-1 and EAGLE-3 on held-out prompts."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec

    target = _load(args.target)
    drafters = {"ngram": "ngram", "medusa-1": args.medusa, "eagle-1": args.eagle1, "eagle-3": args.eagle3}
    rows = []
    for name, spec in drafters.items():
        drafter = load_drafter_spec(spec, target)
        for temperature in (0.0, 1.0):
            for tree in ("chain", "dynamic:4:16" if name.startswith("eagle") else "topk:3"):
                r = evaluate(
                    EvalArgs(
                        target=args.target,
                        drafter=spec,
                        data=args.data,
                        num_prompts=args.num_prompts,
                        max_new_tokens=args.max_new_tokens,
                        depth=5,
                        tree=tree,
                        temperature=temperature,
                        check_lossless=temperature == 0,
                        progress=False,
                    ),
                    target,
                    drafter,
                )
                row = {
                    "drafter": name,
                    "T": temperature,
                    "tree": tree,
                    "tau": r["tau"],
                    "alpha": r["alpha"],
                    "speedup": r["speedup"],
                    "lossless": r["lossless"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import DynamicCache

    from draftsmith.eval.decoder import SpeculativeDecoder
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.kv_cache import crop_to
    from draftsmith.eval.sampling import Sampling
    from draftsmith.eval.tree import parse_tree
    from draftsmith.models.parts import with_cache

    target = _load(args.target)
    prompts = _heldout_prompts(target, args.num_prompts)
    rows = []
    for spec, tree in [("ngram", "chain"), (args.medusa, "chain"), (args.medusa, "topk:3")]:
        decoder = SpeculativeDecoder(target, load_drafter_spec(spec, target), parse_tree(tree, 3), Sampling())
        decoder.generate(prompts[0], 8)  # warm-up
        steps = [s for p in prompts for s in decoder.generate(p, args.max_new_tokens).steps]
        sample = steps[:: max(1, len(steps) // 60)]
        bare = []
        with torch.no_grad():
            for s in sample:
                cache = DynamicCache(config=target.model.config)
                target.model(
                    torch.randint(0, target.vocab_size, (1, s.cache_len)), **with_cache(target.model, cache)
                )
                ids = torch.randint(0, target.vocab_size, (1, s.draft_tokens + 1))
                times = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    target.model(ids, **with_cache(target.model, cache))
                    times.append(time.perf_counter() - t0)
                    crop_to(cache, s.cache_len)
                bare.append(statistics.median(times))
        step_ms = 1e3 * statistics.mean(s.verify_s for s in sample)
        bare_ms = 1e3 * statistics.mean(bare)
        row = {
            "drafter": "ngram" if spec == "ngram" else "medusa-1",
            "tree": tree,
            "steps_timed": len(sample),
            "tokens_per_step": statistics.mean(s.draft_tokens + 1 for s in sample),
            "evaluator_step_ms": step_ms,
            "bare_forward_ms": bare_ms,
            "ratio": step_ms / bare_ms,
            "draft_ms": 1e3 * statistics.mean(s.draft_s for s in sample),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def assisted(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    from draftsmith.eval.decoder import SpeculativeDecoder, plain_decode
    from draftsmith.eval.drafters import LMDrafter
    from draftsmith.eval.sampling import Sampling
    from draftsmith.eval.tree import parse_tree

    target = _load(args.target)
    prompts = _heldout_prompts(target, args.num_prompts)
    drafts = {"trained-1layer": Path(args.draft), "copied-1layer": draft_lm_dir(target, args.out)}
    rows = []
    for draft_name, draft_dir in drafts.items():
        draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
        for k in (3, 5):
            cfg = draft.generation_config
            cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, "constant"
            cfg.assistant_confidence_threshold = 0.0
            decoder = SpeculativeDecoder(target, LMDrafter(draft), parse_tree("chain", k), Sampling())
            totals = {"ours": [0, 0.0], "transformers_assisted": [0, 0.0], "plain_greedy": [0, 0.0]}
            same, steps, step_tokens = True, 0, 0
            for i, prompt in enumerate(prompts):
                ids = torch.tensor([prompt])
                ours = decoder.generate(prompt, args.max_new_tokens)
                t0 = time.perf_counter()
                hf = target.model.generate(
                    ids, assistant_model=draft, max_new_tokens=args.max_new_tokens, do_sample=False
                )
                hf_s = time.perf_counter() - t0
                plain = plain_decode(target, prompt, args.max_new_tokens, Sampling())
                if i == 0:
                    continue  # warm-up
                same &= hf[0, len(prompt) :].tolist() == ours.tokens == plain.tokens
                steps += len(ours.steps)
                step_tokens += ours.step_tokens
                for name, n, s in [
                    ("ours", len(ours.tokens), ours.wall_s),
                    ("transformers_assisted", hf.shape[1] - len(prompt), hf_s),
                    ("plain_greedy", len(plain.tokens), plain.wall_s),
                ]:
                    totals[name][0] += n
                    totals[name][1] += s
            tps = {name: n / s for name, (n, s) in totals.items()}
            row = {
                "draft": draft_name,
                "K": k,
                "tau": step_tokens / steps,
                **{f"{name}_tokens_per_s": v for name, v in tps.items()},
                "ours_vs_assisted": tps["ours"] / tps["transformers_assisted"],
                "assisted_vs_plain": tps["transformers_assisted"] / tps["plain_greedy"],
                "ours_vs_plain": tps["ours"] / tps["plain_greedy"],
                "identical_outputs": same,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tables(args: argparse.Namespace) -> None:
    """Print the saved results as the Markdown tables of docs/BENCHMARKS.md."""
    rows = json.loads((args.out / "matrix.json").read_text())
    for data in dict.fromkeys(r["data"] for r in rows):
        print(f"\n{data}: tau (speedup)\n")
        cols = [(t, d, tree) for t in (0.0, 1.0) for d in (3, 5) for tree in ("chain", "topk:3")]
        grid = []
        for drafter in dict.fromkeys(r["drafter"] for r in rows):
            cells = []
            for t, d, tree in cols:
                (r,) = [
                    r
                    for r in rows
                    if (r["data"], r["drafter"], r["T"], r["depth"], r["tree"]) == (data, drafter, t, d, tree)
                ]
                cells.append(f"{_f(r['tau'])} ({_f(r['speedup'])})")
            grid.append([drafter, *cells])
        print("\n".join(md_table(["drafter", *(f"T={t:g} d={d} {tree}" for t, d, tree in cols)], grid)))
    lossless = [r["lossless"] for r in rows if r["T"] == 0]
    print(f"\nT=0 runs identical to plain greedy decoding: {sum(lossless)}/{len(lossless)}")
    header = [
        "drafter",
        "tree",
        "steps timed",
        "tokens/step",
        "evaluator step (ms)",
        "bare forward (ms)",
        "ratio",
    ]
    overhead = [
        [r["drafter"], r["tree"], r["steps_timed"], _f(r["tokens_per_step"], 1), _f(r["evaluator_step_ms"])]
        + [_f(r["bare_forward_ms"]), _f(r["ratio"], 3)]
        for r in json.loads((args.out / "overhead.json").read_text())
    ]
    print("\n" + "\n".join(md_table(header, overhead)))
    header = ["draft", "K", "tau", "ours tok/s", "transformers assisted tok/s", "plain greedy tok/s"]
    header += ["ours / assisted", "assisted / plain", "ours / plain", "same output"]
    assisted = [
        [r["draft"], r["K"], _f(r["tau"]), _f(r["ours_tokens_per_s"], 0)]
        + [_f(r["transformers_assisted_tokens_per_s"], 0), _f(r["plain_greedy_tokens_per_s"], 0)]
        + [
            _f(r["ours_vs_assisted"]),
            _f(r["assisted_vs_plain"]),
            _f(r["ours_vs_plain"]),
            r["identical_outputs"],
        ]
        for r in json.loads((args.out / "assisted.json").read_text())
    ]
    print("\n" + "\n".join(md_table(header, assisted)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["matrix", "overhead", "assisted", "eagle", "tables"])
    parser.add_argument("--target", help="the toy target directory (small preset)")
    parser.add_argument("--medusa", help="a Medusa-1 checkpoint (final/) with >= 5 heads")
    parser.add_argument("--draft", help="a draft LM directory (build-target --preset small-draft1)")
    parser.add_argument("--eagle1", help="an EAGLE-1 checkpoint (final/)")
    parser.add_argument("--eagle3", help="an EAGLE-3 checkpoint (final/)")
    parser.add_argument("--drafters", help="matrix: only these drafters (comma-separated names)")
    parser.add_argument("--data", default="stdlib:heldout", help="eagle: held-out prompts")
    parser.add_argument("--out", type=Path, required=True, help="where results and the draft go")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "tables":
        tables(args)
        return
    if not args.target:
        parser.error("--target is required")
    torch.manual_seed(0)
    rows = {"matrix": matrix, "overhead": overhead, "assisted": assisted, "eagle": eagle}[args.what](args)
    path = args.out / f"{args.what}.json"
    if args.what == "matrix" and args.drafters and path.is_file():  # replace only the re-measured rows
        names = {r["drafter"] for r in rows}
        rows = [r for r in json.loads(path.read_text()) if r["drafter"] not in names] + rows
    path.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
