"""The architecture matrix: every drafter kind on a tiny random-weight target of every architecture.

    python -m bench.arch_matrix --out runs/matrix [--arch gemma2 --kind eagle3 ...] [--json FILE]

A cell builds the target in-process (toy/tiny_targets.py) with a small byte-level tokenizer, trains the
drafter for 3 steps through the same entry point a user runs (`draftsmith train ...`), requires finite
losses, decodes held-out prompts at T=0 with the target and requires the output to equal plain greedy
decoding token for token, then exports to every engine that serves the pair (models/serving.py) and
requires validation to pass. A pair no engine serves must be refused before training with one line naming
the engines, and is then trained for draftsmith's evaluator (`train.allow_unserved=true`).

The test suite runs cells through `run_cell` (tests/unit/test_architectures.py); this command prints the
whole table for docs/BENCHMARKS.md.

Feeds docs/BENCHMARKS.md, "Architectures".
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.models.families import FAMILIES
from draftsmith.runtime.display import table as md_table
from draftsmith.toy.tiny_targets import ARCHITECTURES, available, build_tiny_target

# Variants the matrix runs beside each family's own tiny run (the record's `tiny_recipe`): name -> (the kind it
# is a variant of and exports as, its recipe (None: the kind's), overrides added to the kind's).
VARIANTS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "medusa2": ("medusa", "medusa/medusa2_toy.yaml", ("medusa2.warmup_steps=1",)),
    "eagle3_qwen3": ("eagle3", None, ("draft.layer=qwen3",)),  # speculators' qwen3 layer: vLLM serves it
}
DRAFT_LAYER = {"eagle3_qwen3": "qwen3"}
EXPORT_KIND = {
    name: kind for name, (kind, _, _) in VARIANTS.items()
}  # the checkpoint kind a variant exports as


def _kinds() -> dict[str, tuple[str, str, list[str]]]:
    """Kind or variant -> (train method, recipe, overrides): every family with a tiny run, each followed by its
    variants (the order decides which cells the default test run covers)."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    for kind, f in FAMILIES.items():
        if f.tiny_recipe is None or f.train_method is None:
            continue
        out[kind] = (f.train_method, f.tiny_recipe, list(f.tiny_overrides))
        for name, (base, recipe, extra) in VARIANTS.items():
            if base == kind:
                out[name] = (f.train_method, recipe or f.tiny_recipe, [*f.tiny_overrides, *extra])
    return out


KINDS = _kinds()
COMMON = [
    "data.train=[stdlib:train]",
    "data.eval=[stdlib:heldout]",
    "data.max_samples=8",
    "data.eval_max_samples=2",
    "data.max_len=64",
    "train.max_steps=3",
    "train.micro_batch_size=2",
    "train.grad_accum=1",
    "checkpoint.every=0",
    "eval.every=0",
    "eval.micro_batch_size=2",
    "log.every=1",
    "log.wandb=false",
]


@dataclass
class CellResult:
    """One architecture x kind cell: `train` / `lossless` / each engine's export, as "ok", "refused: ..." or
    "FAIL: ..."."""

    arch: str
    kind: str
    train: str = ""
    lossless: str = ""
    exports: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def green(self) -> bool:
        """Everything ran, or was refused up front with its reason."""
        parts = [self.train, self.lossless, *self.exports.values()]
        return all(p == "ok" or p.startswith("refused") for p in parts)


def tokenizer() -> Any:
    """The byte-level BPE with the toy chat template that every tiny target shares (400 tokens)."""
    import inspect
    import json as json_module
    import textwrap

    from draftsmith.toy.tokenizer import train_tokenizer

    return train_tokenizer([inspect.getsource(m) for m in (json_module, textwrap, inspect)], vocab_size=400)


def target_dir(arch: str, root: Path) -> Path:
    """The tiny target of `arch` saved under `root` (built once)."""
    out = root / "targets" / arch
    if not (out / "config.json").is_file():
        from transformers import AutoTokenizer

        out.mkdir(parents=True, exist_ok=True)
        tok = tokenizer()
        tok.save_pretrained(out)
        build_tiny_target(arch, tok).save_pretrained(out)
        # Sized for the tokenizer as a user reloads it beside the model: the family's tokenizer class may add
        # tokens (Qwen2's reloads with 401 of 400), and every id needs an embedding row.
        reloaded = AutoTokenizer.from_pretrained(out)
        if len(reloaded) != len(tok):
            build_tiny_target(arch, reloaded).save_pretrained(out)
    return out


def _train(kind: str, target: Path, out: Path, *extra: str) -> None:
    import importlib

    from draftsmith.recipes import __file__ as recipes_init

    method, recipe, overrides = KINDS[kind]
    main = importlib.import_module(f"draftsmith.train.{method}").main
    recipe_path = Path(recipes_init).parent / recipe
    args = ["--config", str(recipe_path), f"target.path={target}", f"output_dir={out}", *COMMON, *overrides]
    code = main([*args, *extra])
    if code:
        raise RuntimeError(f"training exited {code}")


def _finite_losses(run: Path) -> str:
    from draftsmith.train.core.metrics import read_metrics

    losses = [v for r in read_metrics(run / "metrics.jsonl") for k, v in r.items() if k.endswith("loss")]
    if not losses:
        return "FAIL: no loss logged"
    bad = [v for v in losses if not math.isfinite(v)]
    return "ok" if not bad else f"FAIL: {len(bad)} non-finite losses"


def run_cell(arch: str, kind: str, root: Path) -> CellResult:
    """Train, decode and export one cell (see the module docstring); never raises for a cell's failure."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.models.serving import serving_engines, unserved_reason
    from draftsmith.ship.export import main as export_main
    from draftsmith.ship.layouts.target_info import TargetInfo

    result = CellResult(arch, kind)
    start = time.perf_counter()
    target = target_dir(arch, root)
    run = root / "runs" / f"{arch}-{kind}"
    info = TargetInfo(str(target))
    export_kind = EXPORT_KIND.get(kind, kind)
    engines = serving_engines(export_kind, info.config, DRAFT_LAYER.get(kind, "llama"))
    try:
        if not engines:
            reason = unserved_reason(export_kind, info.config)
            try:
                _train(kind, target, run)
                result.train = "FAIL: an unserved pair trained without train.allow_unserved"
            except ValueError as err:  # refused before the first step, as it must be
                result.train = f"refused: {reason}" if "no serving engine" in str(err) else f"FAIL: {err}"
            _train(kind, target, run, "train.allow_unserved=true")
        else:
            _train(kind, target, run)
        finite = _finite_losses(run)
        result.train = finite if finite != "ok" or not result.train else result.train
    except Exception as err:  # noqa: BLE001 - a cell reports any failure as its result
        result.train = f"FAIL: {type(err).__name__}: {err}"[:300]
        result.seconds = time.perf_counter() - start
        return result
    result.train = result.train or "ok"
    try:
        report = evaluate(
            EvalArgs(
                target=str(target),
                drafter=str(run / "final"),
                data="stdlib:heldout",
                num_prompts=2,
                max_new_tokens=16,
                check_lossless=True,
                progress=False,
            )
        )
        result.lossless = "ok" if report["lossless"] is True else "FAIL: differs from greedy decoding"
    except Exception as err:  # noqa: BLE001
        result.lossless = f"FAIL: {type(err).__name__}: {err}"[:300]
    for engine in ("vllm", "sglang", "tgi"):
        if engine not in engines:
            continue
        try:
            export_main(
                [
                    str(run / "final"),
                    "--to",
                    engine,
                    "--out",
                    str(root / "exports" / f"{arch}-{kind}-{engine}"),
                ]
            )
            result.exports[engine] = "ok"
        except Exception as err:  # noqa: BLE001
            result.exports[engine] = f"FAIL: {type(err).__name__}: {err}"[:300]
    result.seconds = time.perf_counter() - start
    return result


def table(results: Sequence[CellResult]) -> str:
    """Markdown: one row per architecture, one column per kind. A cell reads `train / T=0 / exports`: `ok`,
    `ok / lossless / vllm sglang` (the engines whose validated export passed), or `refused up front` for a
    pair no engine serves (then trained with train.allow_unserved for the evaluator); failures are spelled out."""
    kinds = list(dict.fromkeys(r.kind for r in results))
    rows: list[list[str]] = []
    by = {(r.arch, r.kind): r for r in results}
    for arch in dict.fromkeys(r.arch for r in results):
        cells = []
        for kind in kinds:
            r = by.get((arch, kind))
            if r is None:
                cells.append("")
                continue
            train = "refused up front" if r.train.startswith("refused") else r.train
            lossless = "lossless" if r.lossless == "ok" else r.lossless
            exports = " ".join(e if v == "ok" else f"{e} {v}" for e, v in r.exports.items()) or "no engine"
            cells.append(f"{train} / {lossless} / {exports}")
        rows.append([arch, *cells])
    return "\n".join(md_table(["architecture", *kinds], rows))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.arch_matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("runs/arch-matrix"), help="work directory")
    p.add_argument(
        "--arch", action="append", help="architectures (default: all the installed transformers has)"
    )
    p.add_argument("--kind", action="append", choices=list(KINDS), help="drafter kinds (default: all)")
    p.add_argument("--json", type=Path, help="also write every cell's result as JSON")
    args = p.parse_args(argv)
    archs = args.arch or [a for a in ARCHITECTURES if available(a)]
    results = []
    for arch in archs:
        for kind in args.kind or list(KINDS):
            r = run_cell(arch, kind, args.out)
            print(
                f"{arch:12s} {kind:9s} {'green' if r.green else 'RED'} {r.seconds:5.1f}s  train={r.train} "
                f"lossless={r.lossless} exports={r.exports}",
                flush=True,
            )
            results.append(r)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0 if all(r.green for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
