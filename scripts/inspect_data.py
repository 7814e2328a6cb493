"""`draftsmith data inspect`: how a recipe's data renders with the target's chat template.

Prints a few training samples with the trained (assistant) tokens highlighted, then statistics for the
train and eval splits: samples, tokens, trained-token share, truncated and dropped samples. Only the
target's tokenizer is loaded, not its weights.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from draftsmith.scripts.cli import TRAIN_METHODS
from draftsmith.train.core.config_cli import make_parser, parse_args


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

    from draftsmith.train.core.data_inspect import inspect_data

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
