"""What `draftsmith engine-eval` measures and how: one dataclass, filled once from the command line.

Each field is one `--flag` (its metadata holds the help and the flag's options), so the parser is generated
from the fields and no default is written twice. The command line is checked here, before anything runs:
a mistake in a value is one line (`UserError`), the comma-separated level lists arrive as sorted integers.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from draftsmith.runtime.errors import UserError

from .setup import ENGINES

# The level lists: given as text on the command line (`1,2,4,8`), held as the sorted distinct integers.
LEVEL_LISTS = ("depths", "concurrency", "context_lengths")


@dataclass(frozen=True, kw_only=True)
class EngineEvalArgs:
    """engine-eval's settings, in the order `--help` lists their flags."""

    engine: str = field(
        default="vllm", metadata={"help": "the serving engine (default vllm)", "choices": ENGINES}
    )
    target: str = field(metadata={"help": "the target model directory (or .gguf file)"})
    drafter: str = field(metadata={"help": "a draftsmith checkpoint (a run's final/) or ngram"})
    data: str = field(metadata={"help": "prompts, in any format `draftsmith eval` reads"})
    num_prompts: int = field(default=20, metadata={"help": "items to decode (default 20; 0 = all)"})
    max_new_tokens: int = field(default=128, metadata={"help": "new tokens per answer (default 128)"})
    depth: int | None = field(
        default=None, metadata={"help": "draft tokens per step (default: the evaluator's)"}
    )
    depths: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "also run vLLM at these depths, e.g. 1,2,3,5, and check the depth prediction against its "
            "measured speedup at each (engines/depth_check.py); the evaluator then drafts max(--depths) deep "
            "unless --depth is deeper, and the prediction is calibrated at that depth"
        },
    )
    max_speedup_diff: float = field(
        default=0.15,
        metadata={
            "help": "--depths: fail (exit 3) when a predicted speedup is further than this from vLLM's measured "
            "one, relative to the measured (default 0.15)"
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default)"})
    top_p: float = 1.0
    top_k: int = 0
    draft_sample_method: Literal["greedy", "probabilistic"] = field(
        default="greedy",
        metadata={
            "help": "at T > 0, as vLLM's option: greedy = argmax drafts accepted with the target's probability; "
            "probabilistic = drafts sampled from the drafter, accepted with min(1, p/q)"
        },
    )
    batch_size: int = field(
        default=1,
        metadata={
            "help": "requests vLLM decodes together (default 1); the evaluator decodes one at a time, and its "
            "tau does not depend on the batch"
        },
    )
    seed: int = 0
    ngram_min: int = field(default=1, metadata={"help": "ngram drafter: shortest n-gram matched"})
    ngram_max: int = field(default=3, metadata={"help": "ngram drafter: longest n-gram matched"})
    venv: str | None = field(
        default=None, metadata={"help": "the engine's venv (default: where engine-setup puts it)"}
    )
    enforce_eager: bool = field(default=False, metadata={"help": "vLLM without torch.compile (faster start)"})
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "run the modeling code the target ships (config.json `auto_map`), here and in vLLM"
        },
    )
    max_rel_diff: float = field(
        default=0.03,
        metadata={
            "help": "fail (exit 3) when |tau_vllm - tau_draftsmith| / tau_draftsmith is above this (default "
            "0.03); at T > 0, where the engines sample different answers, above this or 3 standard errors of "
            "the difference"
        },
    )
    work_dir: str | None = field(
        default=None, metadata={"help": "keep the export and vLLM's logs here (default: temp)"}
    )
    plain_cache: str | None = field(
        default=None,
        metadata={
            "help": "keep vLLM's plain runs here and reuse one whose job (model, prompt ids, sampling, batch) "
            "is identical: several drafters compared on the same prompts decode them plainly once"
        },
    )
    concurrency: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "also measure vLLM's server with and without the drafter at these requests in flight, "
            "e.g. 1,2,4,8: tokens/s, speedup, and the concurrency from which speculation stops paying "
            "(engines/load_curves.py)"
        },
    )
    context_lengths: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "the same over prompt lengths in tokens, e.g. 512,2048,8192, one request at a time; the "
            "prompts are real documents cut to length (--context-data)"
        },
    )
    context_data: str | None = field(
        default=None,
        metadata={"help": "documents for --context-lengths (default: --data), any data format"},
    )
    context_prompts: int = field(default=4, metadata={"help": "prompts per context length (default 4)"})
    plot: str | None = field(
        default=None,
        metadata={"help": "a PNG of the speedup curves (--concurrency, --context-lengths)"},
    )
    report: str | None = field(default=None, metadata={"help": "write the JSON report here"})
    progress: bool = field(default=True, metadata={"help": "no progress bars"})


def build_parser(description: str) -> argparse.ArgumentParser:
    """One flag per field of EngineEvalArgs, in field order (`--no-progress` for the one that defaults to
    true); the level lists are read as text and checked by `parse_engine_eval_args`."""
    parser = argparse.ArgumentParser(
        prog="draftsmith engine-eval",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hints = get_type_hints(EngineEvalArgs)
    for f in dataclasses.fields(EngineEvalArgs):
        flag, options = flag_options(f, hints[f.name])
        parser.add_argument(flag, dest=f.name, help=f.metadata.get("help"), **options)
    return parser


def flag_options(f: dataclasses.Field[Any], tp: Any) -> tuple[str, dict[str, Any]]:
    """A field's flag and its argparse options: a switch for a bool, text for a level list, else a value of
    the field's type (choices from a Literal or the metadata; required when the field has no default)."""
    flag = "--" + f.name.replace("_", "-")
    if tp is bool:
        if f.default is True:
            return "--no-" + flag.removeprefix("--"), {"action": "store_false"}
        return flag, {"action": "store_true"}
    if f.name in LEVEL_LISTS:
        return flag, {"default": None}
    if f.default is dataclasses.MISSING:
        return flag, {"required": True}
    options: dict[str, Any] = {"default": f.default}
    number = next((t for t in (int, float) if tp is t or t in get_args(tp)), None)  # `int | None` too
    if number is not None:
        options["type"] = number
    if get_origin(tp) is Literal:
        options["choices"] = get_args(tp)
    elif "choices" in f.metadata:
        options["choices"] = f.metadata["choices"]
    return flag, options


def parse_engine_eval_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> EngineEvalArgs:
    """The settings of a command line. A malformed one exits through `parser.error` (status 2); a value out
    of range is one line (`UserError`), checked in the order the flags were always checked."""
    args = parser.parse_args(None if argv is None else list(argv))
    if args.temperature < 0 or args.num_prompts < 0 or args.max_new_tokens < 1 or args.batch_size < 1:
        raise UserError(
            "--temperature and --num-prompts must be >= 0, --max-new-tokens and --batch-size >= 1"
        )
    if Path(args.target).suffix == ".gguf":
        raise UserError(
            "--target: engine-eval serves a model directory; write the GGUF as one first (draftsmith build-target "
            "--preset ... --out DIR, or any directory with config.json and safetensors)"
        )
    levels = {
        name: tuple(int_list(getattr(args, name), "--" + name.replace("_", "-"))) for name in LEVEL_LISTS
    }
    if args.plot and not (levels["concurrency"] or levels["context_lengths"]):
        raise UserError("--plot draws the curves of --concurrency or --context-lengths: pass one of them")
    if args.max_speedup_diff <= 0:
        raise UserError("--max-speedup-diff must be > 0 (a relative difference, e.g. 0.15)")
    if args.context_prompts < 1:
        raise UserError("--context-prompts must be >= 1")
    if args.context_data and not levels["context_lengths"]:
        raise UserError("--context-data holds the documents of --context-lengths: pass --context-lengths too")
    return EngineEvalArgs(**(vars(args) | levels))


def int_list(text: str | None, flag: str) -> list[int]:
    """A comma-separated list of levels, e.g. `8,1,2`, as its sorted distinct integers (each >= 1)."""
    if not text:
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if any(v < 1 for v in values):
        raise UserError(f"{flag} {text!r}: every value must be >= 1")
    return sorted(set(values))
