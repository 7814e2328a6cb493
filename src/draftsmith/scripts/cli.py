"""The `draftsmith` command: one entry point over the recipes and tools.

    draftsmith build-target --preset small --out DIR     train a toy target (CPU, no network)
    draftsmith data inspect --config RECIPE [k=v ...]    show rendered samples and trained tokens
    draftsmith data regenerate --target DIR --data SRC --out FILE
                                                         the target's own answers (distillation data)
    draftsmith data mix SOURCE[@N] ... --out FILE        many sources in one deduplicated, shuffled file
    draftsmith data needed --point TOKENS=REPORT ... --tau X
                                                         the training tokens a tau needs, from a curve
    draftsmith train METHOD --config RECIPE [k=v ...]    train a drafter (single process; use
                                                         `accelerate launch train/METHOD.py` for several);
                                                         the methods and the kinds they train are below
    draftsmith cache METHOD --config RECIPE data.cache=DIR [--storage bf16|fp8]
                                                         run the target once, store the features the
                                                         drafter reads; then train with data.cache=DIR
    draftsmith eval --target DIR --drafter CKPT|ngram|self|HF_DIR --data FILE
                                                         speculative decoding on held-out prompts: tau,
                                                         speedup, lossless check, deployment gate
    draftsmith gate --report NEW.json [--baseline OLD.json] [--min-tau X]
                                                         pass / fail a drafter before it ships
    draftsmith compare A.json B.json [C.json ...]      rank drafters measured on the same prompts: the
                                                         paired difference in tau and its standard error
    draftsmith export CKPT --to vllm|sglang|tgi|hf --out DIR
                                                         the drafter in an engine's layout, validated
    draftsmith push CKPT --repo ORG/NAME [--dry-run DIR] upload with a model card stating what was measured
    draftsmith engine-setup vllm                         install vLLM (CPU or GPU build) in a venv of its own
    draftsmith engine-eval --engine vllm --target DIR --drafter CKPT|ngram --data FILE
                                                         the engine measures the same drafter on the same
                                                         prompts: its tau and tokens/s next to draftsmith's
    draftsmith pipeline --target DIR --data SRC --heldout SRC [--answers local|vllm|URL] [--time-budget MIN]
                                                         the target's answers -> features -> EAGLE-3 -> eval
                                                         beside ngram -> export, on the device present
    draftsmith quickstart [--budget short|long]          the pipeline's SmolLM2-135M-Instruct preset

Each subcommand has its own `--help`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from draftsmith.models.families import family, train_methods
from draftsmith.runtime.errors import run_main
from draftsmith.train.methods import TRAIN_METHODS


def methods_help() -> list[str]:
    """`draftsmith train` methods and the drafter kinds each trains (models/families.py)."""
    return [
        f"  {m:<14} {', '.join(f'{k} ({family(k).title})' for k in kinds)}"
        for m, kinds in sorted(train_methods().items())
    ]


def _train(argv: Sequence[str]) -> int:
    import importlib

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: draftsmith train METHOD [--config FILE] [KEY=VALUE ...] [--resume [CKPT]]\n")
        print("methods (and the drafter kinds they train):")
        print("\n".join(methods_help()))
        print("`draftsmith train METHOD --help` lists every config key of that method.")
        return 0 if argv else 2
    method, rest = argv[0], list(argv[1:])
    if method not in TRAIN_METHODS:
        print(f"draftsmith train: unknown method {method!r}; choose from {', '.join(sorted(TRAIN_METHODS))}")
        return 2
    return int(importlib.import_module(TRAIN_METHODS[method]).main(rest) or 0)


def _data(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: draftsmith data inspect --config RECIPE [KEY=VALUE ...] [--num-samples N] [--no-color]")
        print("       draftsmith data regenerate --target DIR --data SRC --out FILE.jsonl [options]")
        print("       draftsmith data mix SOURCE[@N] ... --out FILE.jsonl [--exclude SRC ...] [--target DIR]")
        print("       draftsmith data needed --point TOKENS=REPORT.json ... --tau X")
        print("`draftsmith data ACTION --help` explains each action.")
        return 0 if argv else 2
    if argv[0] == "inspect":
        from draftsmith.scripts.data.inspect import main as inspect_main

        return inspect_main(list(argv[1:]))
    if argv[0] == "regenerate":
        from draftsmith.scripts.data.regenerate import main as regenerate_main

        return regenerate_main(list(argv[1:]))
    if argv[0] == "mix":
        from draftsmith.scripts.data.mix import main as mix_main

        return mix_main(list(argv[1:]))
    if argv[0] == "needed":
        from draftsmith.scripts.data.needed import main as needed_main

        return needed_main(list(argv[1:]))
    print(f"draftsmith data: unknown action {argv[0]!r}; available: inspect, regenerate, mix, needed")
    return 2


def _cache(argv: Sequence[str]) -> int:
    from draftsmith.train.cache.build import main as cache_main

    return cache_main(list(argv))


def _build_target(argv: Sequence[str]) -> int:
    from draftsmith.toy import build as build_toy_target

    parser = argparse.ArgumentParser(
        prog="draftsmith build-target",
        description=build_toy_target.__doc__,
        epilog=build_toy_target.presets_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    build_toy_target.add_arguments(parser)
    return build_toy_target.run(parser.parse_args(list(argv)))


def _eval(argv: Sequence[str]) -> int:
    from draftsmith.eval.acceptance import parse, run

    return run(parse(list(argv)))


def _gate(argv: Sequence[str]) -> int:
    from draftsmith.eval.gate import main as gate_main

    return gate_main(list(argv))


def _compare(argv: Sequence[str]) -> int:
    from draftsmith.eval.compare import main as compare_main

    return compare_main(list(argv))


def _export(argv: Sequence[str]) -> int:
    from draftsmith.ship.export import main as export_main

    return export_main(list(argv))


def _push(argv: Sequence[str]) -> int:
    from draftsmith.ship.push import main as push_main

    return push_main(list(argv))


def _engine_setup(argv: Sequence[str]) -> int:
    from draftsmith.engines.setup import main as setup_main

    return setup_main(list(argv))


def _engine_eval(argv: Sequence[str]) -> int:
    from draftsmith.engines.engine_eval import main as engine_eval_main

    return engine_eval_main(list(argv))


def _pipeline(argv: Sequence[str]) -> int:
    from draftsmith.scripts.pipeline import main as pipeline_main

    return pipeline_main(list(argv))


def _quickstart(argv: Sequence[str]) -> int:
    from draftsmith.scripts.quickstart import main as quickstart_main

    return quickstart_main(list(argv))


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "build-target": (_build_target, "build a target: a toy Llama trained on real text, or a packaged model"),
    "data": (_data, "inspect a recipe's data; regenerate answers with the target"),
    "train": (_train, f"train a drafter ({', '.join(TRAIN_METHODS)}): draftsmith train METHOD --config ..."),
    "cache": (
        _cache,
        "store a recipe's target features offline (bf16/fp8 shards); train from them with data.cache=DIR",
    ),
    "eval": (_eval, "measure a drafter by real speculative decoding: tau, speedup, --min-tau gate"),
    "gate": (
        _gate,
        "the deployment gate: fail a drafter below --min-tau or regressed from a baseline report",
    ),
    "compare": (
        _compare,
        "rank drafters on the same prompts: paired difference in tau, its error, a verdict",
    ),
    "export": (_export, "write a drafter in an engine's layout (vllm, sglang, tgi, hf), validated first"),
    "push": (_push, "upload a drafter with its engine exports and a model card of what was measured"),
    "engine-setup": (_engine_setup, "install a serving engine (vllm) in a venv of its own"),
    "engine-eval": (
        _engine_eval,
        "measure a drafter in vLLM and in draftsmith's evaluator, side by side (tau within 3%?)",
    ),
    "pipeline": (
        _pipeline,
        "a target and prompts in; its answers, features, EAGLE-3, evaluation beside ngram and export out",
    ),
    "quickstart": (
        _quickstart,
        "train EAGLE-3 for SmolLM2-135M-Instruct on its own answers, measure tau vs ngram",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("commands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<14} {help_text}")
        print("\ntraining methods (draftsmith train METHOD) and the drafter kinds they train:")
        print("\n".join(methods_help()))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from draftsmith.runtime.files import draftsmith_version

        print(f"draftsmith {draftsmith_version()}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"draftsmith: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    command = COMMANDS[argv[0]][0]
    return run_main(lambda rest: command(rest or []), argv[1:])


if __name__ == "__main__":
    sys.exit(main())
