"""Export a draftsmith drafter in the layout a serving engine loads, validated before anything is written.

    draftsmith export CKPT --to vllm|sglang|tgi|hf --out DIR [--target DIR] [--report REPORT.json]
                      [--num-speculative-tokens K]

The engines each drafter kind is exported for, and why the others refuse it, come from the family records
(models/families.py; `draftsmith export --help` prints the table):

The export is checked against the target (the checkpoint's, or --target): the draft layer's shape,
max_position_embeddings and rope settings copied from the target; layer ids translated to the engine's
convention (ship/layouts/common.py has the table); d2t/t2d present and consistent for a pruned vocabulary;
embed_tokens absent or bit-identical to the target's; the biases the engine's modules have. A failed check
writes nothing and names every problem. The directory gets `draftsmith_export.json`: the layout, the
checks that passed, the layer-id translation, and copy-paste serving commands.

vLLM drafts `num_speculative_tokens` per step: --num-speculative-tokens K, else the depth the evaluator's
report recommends (`recommended_depth`, from its measured acceptance and costs: ALGORITHMS.md 9.8; the report
is --report, else the checkpoint's eval.json), else the layout's default, which the summary says. A report
that says speculation does not pay (depth 0) gets a warning, and the drafter is exported anyway.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftsmith.models.checkpoint import read_drafter_config, read_drafter_weights
from draftsmith.models.draft_lm import METADATA_NAME
from draftsmith.models.families import ENGINES, family
from draftsmith.models.serving import engine_table
from draftsmith.runtime.files import check_replaceable, read_json, verify_hashes, write_text
from draftsmith.runtime.run_lock import RunLock

from .layouts.common import EXPORT_RECORD, Export, ExportError, LayoutSpec, validate, write_export
from .layouts.draft_lm import read_draft_lm_state
from .layouts.target_info import TargetInfo, rope_settings
from .serve_depth import check_depth_option, choose_depth

Layout = Callable[[dict[str, Any], TargetInfo, str], tuple[Export, LayoutSpec]]


def layout_for(kind: str, engine: str) -> Layout:
    """The export layout of `kind` for `engine`, from its family record (models/families.py).

    Raises:
        ExportError: the engine does not serve this kind (naming the engines that do).
    """
    record = family(kind)
    if not record.serves(engine):
        options = sorted(e for e in ENGINES if record.serves(e))
        if not options:
            raise ExportError(f"drafter kind {kind!r} has no engine export ({record.why_not.get(engine)})")
        raise ExportError(
            f"{engine} does not serve {kind} drafters; export {kind} with --to {' | '.join(options)}"
        )
    layout: Layout = record.resolve(f"layout:{engine}")
    return layout


def read_source(ckpt: str | Path) -> dict[str, Any]:
    """A checkpoint as exporters see it: `{dir, kind, config, state, target, target_name}`."""
    path = Path(ckpt).expanduser()
    if (path / METADATA_NAME).is_file():  # a distilled draft LM: a transformers directory + draftsmith.json
        meta = read_json(path / METADATA_NAME)
        verify_hashes(path, meta.get("weights_sha256"), str(path / METADATA_NAME))
        return {
            "dir": path,
            "kind": "draft_lm",
            "config": meta,
            "state": read_draft_lm_state(path),
            "target": meta["target"],
            "target_name": meta["target"]["name_or_path"],
        }
    config = read_drafter_config(path)
    state = read_drafter_weights(path, config)
    return {
        "dir": path,
        "kind": config["kind"],
        "config": config,
        "state": state,
        "target": config["target"],
        "target_name": config["target"]["name_or_path"],
    }


def check_target(source: dict[str, Any], target: TargetInfo) -> None:
    """Refuse a target the drafter was not trained for, or a checkpoint whose saved target config disagrees
    with the target on positions or rope (a draft config with max_position_embeddings 2048 under a 128K
    target ran at tau ~1 in SGLang: SpecForge#271)."""
    saved = source["target"]
    actual = {
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "num_layers": target.num_layers,
    }
    wrong: dict[str, tuple[Any, Any]] = {
        k: (saved.get(k), v) for k, v in actual.items() if saved.get(k) not in (None, v)
    }
    if not wrong and (saved.get("tokenizer_sha256") or saved.get("weights_sha256")):
        hashes = (
            target.identity_hashes()
        )  # a model of the same shapes (a fine-tune, another tokenizer) differs here
        wrong = {
            k: (saved.get(k), v) for k, v in hashes.items() if v is not None and saved.get(k) not in (None, v)
        }
    if wrong:
        raise ExportError(
            "the drafter was trained for another target: "
            + ", ".join(f"{k} {a} (checkpoint) vs {b} ({target.path})" for k, (a, b) in wrong.items())
            + "; pass --target with the model it was trained on"
        )
    saved_config = source["config"].get("target_config")
    if saved_config is None:
        return
    problems = []
    if saved_config.get("max_position_embeddings") != target.max_positions():
        problems.append(
            f"max_position_embeddings {saved_config.get('max_position_embeddings')} in the checkpoint, "
            f"{target.max_positions()} in the target"
        )
    if rope_settings(saved_config) != target.rope():
        problems.append(
            f"rope {rope_settings(saved_config)} in the checkpoint, {target.rope()} in the target"
        )
    if problems:
        raise ExportError(
            "the checkpoint's saved target config disagrees with the target: "
            + "; ".join(problems)
            + ". An engine would run the draft with the wrong positions (SpecForge#271). Export refused: retrain "
            "or re-save the drafter against this target, or pass the right --target."
        )


def export(
    ckpt: str | Path,
    to: str,
    out: str | Path,
    target_path: str | None = None,
    revision: str | None = None,
    report: str | Path | None = None,
    num_speculative_tokens: int | None = None,
) -> tuple[Path, list[str], Export]:
    """Export `ckpt` for engine `to` into `out`; returns `(out, checks passed, the export)`. vLLM's depth is
    `num_speculative_tokens`, else the recommendation of `report` (else of the checkpoint's eval.json), else
    the layout's default (`choose_depth`).

    Raises:
        ExportError: the pair is unsupported, the target does not match, the depth cannot be served, or
            validation failed (nothing written).
    """
    if to not in ENGINES:
        raise ExportError(f"--to {to!r}: choose one of {', '.join(ENGINES)}")
    check_depth_option(num_speculative_tokens)
    source = read_source(ckpt)
    kind = source["kind"]
    layout = layout_for(kind, to)
    target = TargetInfo(target_path or source["target_name"], revision or source["target"].get("revision"))
    check_target(source, target)
    built, spec = layout(source, target, to)
    built.depth_choice = choose_depth(built, source, report, num_speculative_tokens)
    passed = validate(built, spec, target)
    out = Path(out).expanduser()
    src_info = {"checkpoint": str(Path(ckpt).resolve()), "kind": kind, "target": source["target_name"]}
    eval_json = source["dir"] / "eval.json"
    if eval_json.is_file():  # the measured report travels with the export (the Hub card reads it)
        text = eval_json.read_text()
        built.extra["eval.json"] = lambda tmp: write_text(tmp / "eval.json", text)
    # One writer per export directory (the lock sits beside it: the directory holds only the export).
    with RunLock(out.parent, "export", name=f".{out.name}.draftsmith.lock"):
        # an earlier export is replaced only when it holds nothing but what draftsmith wrote there
        check_replaceable(out, EXPORT_RECORD, "--out", "a draftsmith export")
        write_export(built, out, src_info, passed)
    return out, passed, built


def help_text() -> str:
    """The module docstring with the kind -> engines table written from the family records."""
    head, sep, tail = (__doc__ or "").partition("\n\nThe export is checked")
    return f"{head}\n\n{engine_table()}{sep}{tail}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith export",
        description=help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="a draftsmith drafter checkpoint (a training run's final/ directory)")
    p.add_argument("--to", required=True, choices=ENGINES, help="the engine whose layout to write")
    p.add_argument(
        "--out", required=True, help="output directory (created; replaced if it is an earlier export)"
    )
    p.add_argument(
        "--target",
        default=None,
        help="the target model directory / Hub id (default: the checkpoint's target)",
    )
    p.add_argument("--revision", default=None, help="the target's Hub revision")
    p.add_argument(
        "--report",
        default=None,
        metavar="REPORT.json",
        help="the evaluator report whose recommended depth vLLM drafts (default: the checkpoint's eval.json)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help="tokens vLLM drafts per step (default: the report's recommended depth, else the layout's)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    out, passed, built = export(
        args.checkpoint,
        args.to,
        args.out,
        args.target,
        args.revision,
        args.report,
        args.num_speculative_tokens,
    )
    print(f"exported {built.layout} to {out}")
    for check in passed:
        print(f"  ok  {check}")
    for note in built.notes:
        print(f"  note: {note}")
    if built.depth_choice is not None:
        print(f"  depth: {built.depth_choice['message']}")
        if built.depth_choice["warning"]:
            print(f"  WARNING: {built.depth_choice['warning']}")
    for cmd in built.serve:
        print("  serve: " + cmd.replace("{dir}", str(out)))
    return 0


if __name__ == "__main__":
    import sys

    from draftsmith.runtime.errors import run_main

    sys.exit(run_main(main, sys.argv[1:]))
