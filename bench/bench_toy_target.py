"""Build the toy-target presets and print a Markdown section for docs/BENCHMARKS.md.

    python bench/bench_toy_target.py --out-root /tmp/toy-bench --output toy_bench.md

The section has one table row per preset (parameters, tokens seen, wall time, losses) and the greedy answers
of the last preset to held-out stdlib docstrings, so a reader can judge what the target writes.

Feeds docs/BENCHMARKS.md, "Toy targets".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from draftsmith.data.stdlib_corpus import stdlib_conversations, stdlib_summary
from draftsmith.runtime.display import table as md_table
from draftsmith.toy.target import PRESETS, build_toy_target, greedy_samples


def _row(info: dict[str, Any]) -> list[str]:
    p = info["preset_values"]
    heldout = info["heldout_loss"]
    return [
        f"`{info['preset']}`",
        f"{info['num_parameters'] / 1e6:.2f}M",
        f"{p['num_layers']} x {p['hidden_size']}",
        str(info["vocab_size"]),
        f"{info['train_tokens_seen'] / 1e6:.2f}M",
        f"{info['wall_time_s']:.0f} s",
        f"{info['initial_train_loss']:.2f} -> {info['train_loss']:.2f}",
        "n/a" if heldout is None else f"{heldout:.2f}",
    ]


TOY_HEADER = ["preset", "parameters", "layers x hidden", "vocab", "tokens seen", "wall time"]
TOY_HEADER += ["train loss (first -> last 20 steps)", "held-out loss"]


def _fence(text: str) -> str:
    fence = "````" if "```" in text else "```"  # docstrings may themselves hold Markdown code blocks
    return f"{fence}python\n{text}\n{fence}"


def render(infos: list[dict[str, Any]], samples: list[tuple[str, str, str]], sample_preset: str) -> str:
    """The Markdown section: environment, the build table, and (id, prompt, completion) samples."""
    summary = stdlib_summary()
    lines = [
        "## Toy targets (CPU)",
        "",
        f"Built by `bench/bench_toy_target.py` on {os.cpu_count()} CPU cores ({platform.machine()}, "
        f"torch threads {torch.get_num_threads()}), Python {infos[0]['python_version']}, torch "
        f"{infos[0]['torch_version']}, transformers {infos[0]['transformers_version']}, seed {infos[0]['seed']}. "
        f"Corpus: the standard library as conversations (user: signature + docstring, assistant: body); "
        f"{summary['train']['conversations']} training conversations from {summary['train']['modules']} modules, "
        f"{summary['heldout']['conversations']} held-out conversations from {summary['heldout']['modules']} "
        "other modules. Losses are next-token cross-entropy in nats per token over packed blocks (all tokens); "
        "the presets have different tokenizers, so losses compare within a row, not across rows. Wall time "
        "includes the corpus scan (cached after the first run), tokenizer training and held-out evaluation.",
        "",
        *md_table(TOY_HEADER, [_row(info) for info in infos]),
    ]
    if samples:
        lines += ["", f"### Greedy answers of `{sample_preset}` to held-out docstrings", ""]
        for fid, prompt, completion in samples:
            lines += [f"`{fid}`: prompt", "", _fence(prompt), "", "completion", "", _fence(completion), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Build each preset into --out-root (a temporary directory by default) and print the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", type=Path, default=None, help="where to build (default: a temp dir)")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=3, help="greedy samples of the last preset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reuse", action="store_true", help="reuse builds already in --out-root")
    parser.add_argument("--output", type=Path, default=None, help="also write the section to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="toy-bench-") as tmp:
        root = args.out_root or Path(tmp)
        infos = []
        for preset in args.presets:
            out = root / f"toy-{preset}"
            if args.reuse and (out / "build.json").is_file():
                infos.append(json.loads((out / "build.json").read_text()))
            else:
                print(f"building {preset} into {out} ...", file=sys.stderr, flush=True)
                infos.append(build_toy_target(preset, out, seed=args.seed, force=True))
        last = root / f"toy-{args.presets[-1]}"
        ids = [c["id"] for c in stdlib_conversations("heldout")[: args.samples]]
        pairs = greedy_samples(last, n=args.samples, max_new_tokens=args.max_new_tokens)
        samples = [(fid, prompt, completion) for fid, (prompt, completion) in zip(ids, pairs, strict=True)]
        section = render(infos, samples, args.presets[-1])
    print(section)
    if args.output is not None:  # stdout may also carry third-party import-time warnings
        args.output.write_text(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
