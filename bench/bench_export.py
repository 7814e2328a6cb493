"""Export every trained drafter to every engine layout and measure that the export computes what was trained.

    python -m bench.bench_export --eagle3 CKPT --eagle1 CKPT --medusa CKPT --mtp CKPT \
        --draft-lm DIR [--speculators-python /path/to/venv/bin/python] --out DIR

Run from a repository checkout (it reads the engine-layout loaders of tests/unit/ship/engine_reference.py,
written from the engines' documentation). For each drafter and engine: the layout, the validation result
(checks passed), the max abs logit difference between draftsmith's forward and the documented-layout loader
on real text through the real target, and for EAGLE-3 -> vLLM the closed loop through speculators' own
Eagle3DraftModel (engines/check_engine_load.py). Prints a Markdown table (docs/BENCHMARKS.md).

Feeds docs/BENCHMARKS.md, "Engine exports".
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from draftsmith.runtime.display import table as md_table

REPO = Path(__file__).resolve().parents[1]


def _engine_reference() -> Any:
    """tests/unit/ship/engine_reference.py: the engines' own forward passes, re-implemented for the tests."""
    spec = importlib.util.spec_from_file_location(
        "engine_reference", REPO / "tests/unit/ship/engine_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc_diff(kind: str, engine: str, out: Path, ckpt: str, built_layout: str) -> float:
    ref = _engine_reference()

    from draftsmith.engines.check_engine_load import sample_ids
    from draftsmith.models.checkpoint import load_drafter, read_drafter_config
    from draftsmith.models.mtp import shift_tokens
    from draftsmith.models.parts import shift_left
    from draftsmith.models.target import FrozenTarget, TargetConfig

    if kind == "draft_lm":
        from transformers import AutoModelForCausalLM

        a = AutoModelForCausalLM.from_pretrained(ckpt).eval()
        b = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        ids = torch.arange(48)[None] % a.config.vocab_size
        with torch.no_grad():
            return float((a(ids).logits - b(ids).logits).abs().max())
    config = read_drafter_config(ckpt)
    target = FrozenTarget.load(TargetConfig(path=config["target"]["name_or_path"], dtype="float32"))
    draft, _ = load_drafter(ckpt, target)
    ids = sample_ids(target.tokenizer, 48)
    feats, _ = target.forward(ids, layer_ids=draft.feature_layers)
    emb, head = target.embed_tokens.weight, target.lm_head.weight
    with torch.no_grad():
        if kind == "eagle3":
            g = torch.cat([feats[k] for k in draft.feature_layers], -1)
            ours = draft.unroll(g, ids)[0][0]
            prefix, key = (
                ("midlayer.", None) if engine == "sglang" else ("layers.0.", "transformer_layer_config")
            )
            theirs = ref.eagle3_step0(out, g[0], shift_left(ids)[0], emb, prefix, key)
            theirs = theirs[:, draft.to_target_ids(torch.arange(draft.draft_vocab_size))]
        elif kind == "eagle":
            f = feats["final"]
            ours = draft.logits(draft(f, shift_left(ids)))[0]
            theirs = ref.eagle1_step(out, f[0], shift_left(ids)[0], emb, head)
        elif kind == "medusa":
            ours = draft(feats["final"])[:, 0]
            theirs = ref.medusa_heads(
                out, feats["final"][0], "vllm" if engine == "vllm" else "fasterdecoding"
            )
        else:  # mtp
            h = feats[draft.feature_layers[0]]
            ours = draft(h, ids)[0][0]
            theirs = ref.nextn_module1(out, h[0], shift_tokens(ids, 1)[0])
    return float((ours - theirs).abs().max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("eagle3", "eagle1", "medusa", "medusa2", "mtp", "draft-lm"):
        p.add_argument(f"--{name}", default=None, help=f"a trained {name} checkpoint")
    p.add_argument(
        "--speculators-python", default=None, help="python of a venv with speculators (closed loop)"
    )
    p.add_argument("--out", default=None, help="where to keep the exports (default: a temporary directory)")
    args = p.parse_args(argv)
    from draftsmith.engines.check_engine_load import run_closed_loop
    from draftsmith.models.families import ENGINES, family
    from draftsmith.ship.export import export, read_source

    root = Path(args.out or tempfile.mkdtemp(prefix="draftsmith-exports-"))
    rows: list[dict[str, Any]] = []
    for name in ("eagle3", "eagle1", "medusa", "medusa2", "mtp", "draft_lm"):
        ckpt = getattr(args, name)
        if ckpt is None:
            continue
        kind = read_source(ckpt)["kind"]
        for engine in ENGINES:
            if not family(kind).serves(engine) or engine == "hf":
                continue
            out, passed, built = export(ckpt, engine, root / f"{name}-{engine}")
            row = {
                "drafter": name,
                "engine": engine,
                "layout": built.layout,
                "checks": len(passed),
                "doc": _doc_diff(kind, engine, out, ckpt, built.layout),
                "engine_code": None,
            }
            if kind == "eagle3" and engine == "vllm" and args.speculators_python:
                report = run_closed_loop(ckpt, str(out), args.speculators_python)
                row["engine_code"] = (
                    f"{report['max_abs_diff']:.1e} (speculators {report['speculators_version']}, "
                    f"{report['steps']} TTT steps, {report['tokens']} tokens)"
                )
            rows.append(row)
            print(
                f"{name} -> {engine}: {built.layout}, {len(passed)} checks, doc-loader diff {row['doc']:.1e}",
                file=sys.stderr,
            )
    header = ["drafter", "--to", "layout", "validation", "max abs diff, documented-layout loader"]
    header += ["max abs diff, engine's own code"]
    cells = [
        [r["drafter"], r["engine"], r["layout"], f"passed ({r['checks']} check groups)", f"{r['doc']:.1e}"]
        + [r["engine_code"] or "- (not installable here)"]
        for r in rows
    ]
    print("\n".join(md_table(header, cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
