"""Build a target directory: train a toy target (tokenizer + small Llama) on CPU, or write a pretrained model
that installs from the package registry (models/gguf.py) as a safetensors directory.

    python -m draftsmith.toy.build --preset small --out targets/toy-small
    python -m draftsmith.toy.build --preset tiny --out /tmp/toy --corpus /data/gsm8k/train.jsonl
    draftsmith build-target --preset smollm2-135m-instruct      # into $DRAFTSMITH_CACHE/targets/

The same code runs as `draftsmith build-target`, which reuses `add_arguments` and `run`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from draftsmith.models.gguf import PACKAGED, NotInstalled, build_packaged
from draftsmith.runtime.files import user_cache
from draftsmith.toy.presets import PRESETS
from draftsmith.toy.target import build_toy_target


def default_target_dir(preset: str, seed: int = 0) -> Path:
    """Where a preset is built when no --out is given: `$DRAFTSMITH_CACHE/targets/<preset>[-seed<seed>]`."""
    return user_cache() / "targets" / (preset if preset in PACKAGED else f"{preset}-seed{seed}")


def presets_help() -> str:
    rows = [
        f"  {name:<6} {p.num_layers} layers x {p.hidden_size} hidden, vocab {p.vocab_size}, "
        f"{p.max_steps} steps of {p.batch_size}x{p.seq_len} tokens"
        for name, p in PRESETS.items()
    ]
    packaged = [f"  {name}: {m.hub_id} ({m.license}), from {m.install}" for name, m in PACKAGED.items()]
    return (
        "toy presets (tiny: about 1 minute on 2 CPU cores, for tests; small: about 5 minutes):\n"
        + "\n".join(rows)
        + "\npretrained presets (the GGUF in a registry package, dequantized to float32 once):\n"
        + "\n".join(packaged)
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the build options to `parser` (shared with the `draftsmith build-target` subcommand)."""
    parser.add_argument(
        "--preset", required=True, choices=[*sorted(PRESETS), *sorted(PACKAGED)], help="which target (below)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        default=None,
        help="output directory (default: $DRAFTSMITH_CACHE/targets/<preset>, ~/.cache/draftsmith when unset)",
    )
    parser.add_argument(
        "--corpus",
        nargs="+",
        metavar="SOURCE",
        default=None,
        help="training data: 'stdlib' (default: the standard library's functions as conversations, about "
        "5%% of modules held out) and/or conversation or text files (.jsonl/.json/.parquet/.txt; about 5%% "
        "of records held out)",
    )
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch-order seed (default 0)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    parser.add_argument(
        "--max-steps", type=int, default=None, metavar="N", help="override the preset's steps"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")


def run(args: argparse.Namespace) -> int:
    """Build the target described by parsed `args`; print a summary. Returns the exit status."""
    args.out = args.out or default_target_dir(args.preset, args.seed)
    if args.preset in PACKAGED:
        return _write_packaged(args)
    if args.max_steps is not None and args.max_steps < 1:
        print(f"error: --max-steps {args.max_steps} must be >= 1", file=sys.stderr)
        return 2
    try:
        info = build_toy_target(
            args.preset,
            args.out,
            corpus=args.corpus,
            seed=args.seed,
            force=args.force,
            max_steps=args.max_steps,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError) as err:  # user mistakes: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    heldout = info["heldout_loss"]
    print(
        f"built toy target '{info['preset']}' at {args.out}\n"
        f"  parameters      {info['num_parameters']:,} (vocab {info['vocab_size']})\n"
        f"  corpus          {', '.join(info['corpus'])}: {info['num_train_conversations']} train / "
        f"{info['num_heldout_conversations']} held-out records\n"
        f"  tokens seen     {info['train_tokens_seen']:,} ({info['train_tokens']:,} in the training split)\n"
        f"  train loss      {info['initial_train_loss']:.3f} -> {info['train_loss']:.3f}\n"
        f"  held-out loss   {'n/a' if heldout is None else f'{heldout:.3f}'}\n"
        f"  wall time       {info['wall_time_s']:.0f} s (training {info['train_time_s']:.0f} s)"
    )
    return 0


def _write_packaged(args: argparse.Namespace) -> int:
    kept = (args.out / "build.json").is_file() and not args.force
    try:
        info = build_packaged(args.preset, args.out, force=args.force)
    except (NotInstalled, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"target '{info['preset']}' at {args.out}{' (already built; --force rebuilds)' if kept else ''}\n"
        f"  from            {info['package']} {info['package_version']}: {info['gguf_file']}\n"
        f"  gguf sha256     {info['gguf_sha256']}\n"
        f"  model           {info['architecture']}, {info['num_parameters']:,} parameters, {info['dtype']}\n"
        f"  weights         {info['hub_id']} ({info['license']})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=presets_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
