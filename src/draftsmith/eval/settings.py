"""What `draftsmith eval` measures and how: one dataclass, read by the same strict loader as the training
recipes. `draftsmith eval --config eval.yaml key=value` and the `--flag value` form set the same fields (the
flags are generated from the fields here, so no default is written twice); unknown keys, wrong types and
missing required keys fail naming the key."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args, get_origin, get_type_hints

from draftsmith.config.cli import make_parser
from draftsmith.config.loader import ConfigError, load_config


@dataclass
class EvalArgs:
    """The evaluator's settings (YAML keys, `KEY=VALUE` overrides, or `--key value` flags)."""

    target: str = field(
        metadata={"help": "Target model: a local directory, a .gguf file or a Hugging Face Hub id."}
    )
    drafter: str = field(
        metadata={
            "help": "ngram (prompt lookup), self (the target drafts for itself: a sanity check), a draftsmith "
            "checkpoint directory (a run's final/), or a Hugging Face causal LM sharing the target's "
            "tokenizer."
        }
    )
    data: str = field(
        metadata={
            "help": "Prompts: a .jsonl/.json/.parquet file in any format of the data pipeline (messages, "
            "sharegpt, alpaca, turns, pair), a save_to_disk directory, hf:owner/name[:split] or "
            "stdlib:heldout."
        }
    )
    format: str = field(
        default="auto", metadata={"help": "Data format (auto: detected from the first record)."}
    )
    num_prompts: int = field(default=20, metadata={"help": "Items to evaluate (0 = all)."})
    max_new_tokens: int = field(default=128, metadata={"help": "New tokens per answer."})
    depth: int | None = field(
        default=None, metadata={"help": "Draft depth K (null: 5, or the drafter's maximum if smaller)."}
    )
    tree: str = field(
        default="chain",
        metadata={
            "help": "Draft tree: chain, topk:K (K alternatives per depth), sample:K (K sampled alternatives, "
            "LM drafters at T>0), paths:FILE (JSON list of rank paths, Medusa style), or dynamic:K:N "
            "(EAGLE-2 dynamic tree of N drafts, EAGLE drafters)."
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy; > 0 = sampling."})
    draft_sample_method: Literal["auto", "greedy", "probabilistic"] = field(
        default="auto",
        metadata={
            "help": "At T > 0, how a chain's drafts are made (vLLM's option of the same name): greedy = the "
            "drafter's top-ranked tokens, each accepted with the target's probability of it; probabilistic = "
            "tokens sampled from the drafter's distribution q, accepted with min(1, p/q); auto = the drafter's "
            "own (LM drafters sample, heads rank). Trees say it in --tree (topk:K or sample:K)."
        },
    )
    top_p: float = field(
        default=1.0, metadata={"help": "Nucleus sampling, applied to target and draft alike."}
    )
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0 = off), applied to both alike."})
    seed: int = field(default=0, metadata={"help": "Sampling seed (each answer gets seed-derived streams)."})
    acceptance: Literal["exact", "typical"] = field(
        default="exact",
        metadata={"help": "exact = lossless verification; typical = Medusa's typical acceptance (LOSSY)."},
    )
    baseline: bool = field(default=True, metadata={"help": "Also run plain decoding (for the speedup)."})
    check_lossless: bool = field(
        default=False, metadata={"help": "At T=0, check that every answer equals plain greedy decoding."}
    )
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cpu, cuda, cuda:1, ..."})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "The target's (and drafter's) dtype."}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Run the modeling code the target ships (config.json `auto_map`); only for code you trust."
        },
    )
    kv_cache: Literal["auto", "fp8"] = field(
        default="auto",
        metadata={
            "help": "The target's key/value cache: auto (the model's dtype) or fp8 (float8 e4m3 with a "
            "per-tensor scale, as vLLM's --kv-cache-dtype fp8; the plain-decoding baseline uses it too)."
        },
    )
    ngram_max: int = field(default=3, metadata={"help": "Longest n-gram the ngram drafter matches."})
    ngram_min: int = field(default=1, metadata={"help": "Shortest n-gram the ngram drafter matches."})
    ngram_match: Literal["latest", "earliest"] = field(
        default="latest",
        metadata={
            "help": "Which earlier occurrence of the longest matching n-gram the ngram drafter continues: the "
            "latest, or the earliest (vLLM's n-gram proposer; engine-eval uses it)."
        },
    )
    drafts_at_budget: Literal["shrink", "full"] = field(
        default="shrink",
        metadata={
            "help": "Near --max-new-tokens: shrink = the draft depth shrinks so that no draft reaches past it "
            "(transformers' rule); full = drafts keep their depth and acceptances past it count, as vLLM's "
            "scheduler does (it schedules no partial drafts; engine-eval uses it). The answer stops at "
            "--max-new-tokens either way."
        },
    )
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})
    # What to do with the report.
    report: str | None = field(default=None, metadata={"help": "Write the JSON report here."})
    plot: str | None = field(
        default=None,
        metadata={
            "help": "Write a PNG here: acceptance by depth, and tau by category, by context length and by span "
            "where the data has them."
        },
    )
    save_eval: bool = field(
        default=False, metadata={"help": "Write the report as eval.json in the checkpoint."}
    )
    min_tau: float | None = field(
        default=None,
        metadata={
            "help": "Deployment gate (eval/gate.py): exit status 3 when tau is below this or the lossless "
            "check failed."
        },
    )


def build_parser(description: str) -> argparse.ArgumentParser:
    """`--config FILE`, `KEY=VALUE` overrides, and one `--key` flag per field (`--no-key` for a field that
    defaults to true); every key is listed with its type and default in `--help`."""
    parser = make_parser(EvalArgs, prog="draftsmith eval", description=description)
    hints = get_type_hints(EvalArgs)
    for f in dataclasses.fields(EvalArgs):
        tp, name, text = hints[f.name], f.name.replace("_", "-"), f.metadata.get("help")
        if tp is bool:
            negated = f.default is True
            parser.add_argument(
                f"--no-{name}" if negated else f"--{name}",
                dest=f.name,
                action="store_const",
                const=not negated,
                default=argparse.SUPPRESS,
                help=f"Turn off (on by default): {text[0].lower()}{text[1:]}" if negated and text else text,
            )
            continue
        choices = list(get_args(tp)) if get_origin(tp) is Literal else None
        parser.add_argument(
            f"--{name}",
            dest=f.name,
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=None if choices else name.upper().replace("-", "_"),
            help=text,
        )
    return parser


def parse_eval_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> EvalArgs:
    """The settings from `--config`, then the `KEY=VALUE` overrides, then the flags (the command line wins over
    the file). A mistake exits through `parser.error`: one line, status 2."""
    args = parser.parse_intermixed_args(None if argv is None else list(argv))
    hints = get_type_hints(EvalArgs)
    flags = []
    for f in dataclasses.fields(EvalArgs):
        if f.name in vars(args):
            value = getattr(args, f.name)
            # Text fields go in as JSON strings (valid YAML), so a value such as `topk:2` stays text; numbers
            # go in as typed, so the strict loader checks them as it checks a recipe.
            text = (
                json.dumps(value)
                if isinstance(value, bool) or str in get_args(hints[f.name]) or hints[f.name] is str
                else value
            )
            flags.append(f"{f.name}={text}")
    try:
        return load_config(EvalArgs, args.config, [*args.overrides, *flags])
    except ConfigError as err:
        parser.error(" ".join(str(err).split()))
