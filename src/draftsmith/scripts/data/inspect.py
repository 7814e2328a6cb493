"""`draftsmith data inspect`: how a recipe's data renders with the target's chat template.

Prints a few training samples with the trained (assistant) tokens highlighted, then statistics for the
train and eval splits: samples, tokens, trained-token share, truncated and dropped samples. Only the
target's tokenizer is loaded, not its weights. Reading the rendered text is the fastest way to catch a wrong
chat template, a loss mask that covers the prompt, or a double BOS before spending a training run on it.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from transformers import PreTrainedTokenizerBase

from draftsmith.config.cli import make_parser, parse_args
from draftsmith.train.core.data import DataConfig, build_datasets
from draftsmith.train.methods import TRAIN_METHODS

TRAINED_ANSI = ("\x1b[42m\x1b[30m", "\x1b[0m")  # black on green
TRAINED_PLAIN = ("«", "»")


def highlight_trained(
    tokenizer: PreTrainedTokenizerBase, input_ids: list[int], loss_mask: list[int], color: bool = False
) -> str:
    """Decode `input_ids` with each run of trained tokens wrapped in markers.

    Args:
        tokenizer: decodes the ids (special tokens are kept visible).
        input_ids: one sample's ids.
        loss_mask: 1/True where the token is trained.
        color: ANSI green background for trained runs; otherwise `«` and `»` around them.

    Returns:
        The decoded text. Runs are decoded separately, so a multi-byte character split across a run
        boundary shows as a replacement character.
    """
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask {len(loss_mask)}")
    start, end = TRAINED_ANSI if color else TRAINED_PLAIN
    parts = []
    pairs = zip(input_ids, loss_mask, strict=True)
    for trained, run in itertools.groupby(pairs, key=lambda pair: bool(pair[1])):
        text = cast(str, tokenizer.decode([token for token, _ in run], skip_special_tokens=False))
        parts.append(f"{start}{text}{end}" if trained else text)
    return "".join(parts)


def inspect_data(
    cfg: DataConfig,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    num_samples: int = 3,
    color: bool = False,
) -> str:
    """The first `num_samples` training samples, rendered and highlighted, then the train and eval stats.

    Args:
        cfg: the data config to inspect (the whole data set is rendered, for the stats).
        tokenizer: the target's tokenizer.
        seed: the run seed (it decides which records are held out for eval).
        num_samples: how many training samples to show.
        color: ANSI colors (for a terminal) instead of `«»` markers.

    Returns:
        A multi-line report.
    """
    bundle = build_datasets(cfg, tokenizer, seed, progress=False)
    lines = []
    for i in range(min(num_samples, len(bundle.train))):
        sample = bundle.train[i]
        ids, mask = sample["input_ids"].tolist(), sample["loss_mask"].tolist()
        lines.append(f"=== {bundle.train.sources[i]} ({len(ids)} tokens, {sum(mask)} trained) ===")
        lines.append(highlight_trained(tokenizer, ids, mask, color))
        lines.append("")
    lines.append(bundle.stats["train"].format_table("train"))
    lines.append(bundle.stats["eval"].format_table("eval"))
    return "\n".join(lines)


def _method_of(argv: Sequence[str]) -> str:
    """The recipe's method, from `--method` or the recipe's folder (recipes/<method>/<name>.yaml)."""
    args = list(argv)
    if "--method" in args and args.index("--method") + 1 < len(args):
        return args[args.index("--method") + 1]
    if "--config" in args and args.index("--config") + 1 < len(args):
        folder = Path(args[args.index("--config") + 1]).parent.name
        if folder in TRAIN_METHODS:
            return folder
    return "medusa"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    method = _method_of(argv)
    if method not in TRAIN_METHODS:
        raise ValueError(f"--method {method!r} is unknown; choose from {', '.join(sorted(TRAIN_METHODS))}")
    recipe_cls = importlib.import_module(TRAIN_METHODS[method]).RECIPE
    parser = make_parser(recipe_cls, prog="draftsmith data inspect", description=__doc__ or "")
    parser.add_argument("--method", default=method, help="recipe method (default: the recipe's folder name)")
    parser.add_argument("--num-samples", type=int, default=3, help="training samples to show (default 3)")
    parser.add_argument(
        "--no-color", action="store_true", help="mark trained tokens with «» instead of color"
    )
    cfg, args = parse_args(recipe_cls, parser, argv)

    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            cfg.target.path, revision=cfg.target.revision, trust_remote_code=cfg.target.trust_remote_code
        )
    except OSError as err:
        raise FileNotFoundError(
            f"could not load the tokenizer of target.path={cfg.target.path!r}: {err}"
        ) from err
    color = sys.stdout.isatty() and not args.no_color
    print(inspect_data(cfg.data, tokenizer, seed=cfg.seed, num_samples=args.num_samples, color=color))
    return 0
