"""Every drafter family vLLM serves, measured by vLLM and by draftsmith's evaluator on the same prompts
(docs/BENCHMARKS.md, "vLLM as the judge").

    python -m bench.engine_sweep [--target DIR] [--out DIR] [--only eagle3,medusa] [--temperature 0]
        [--draft-sample-method greedy|probabilistic] [--num-prompts 8] [--max-new-tokens 64]

Each family is trained by its short recipe on the `tiny` toy target (built when --target is not given), then
`draftsmith engine-eval --engine vllm` serves it beside the target in vLLM (`draftsmith engine-setup vllm`
first) and prints both engines' figures; ngram needs no training; MTP is asked too, to show its refusal line.
The table (Markdown, on stdout and in OUT/table.md) gives per family: vLLM's method, tau in vLLM and in
draftsmith, their relative difference, acceptance by position in both, the lossless checks and each engine's
own speedup. A failure of one family is a row with its one-line reason, not the end of the sweep.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from draftsmith.engines.engine_report import cell
from draftsmith.recipes import __file__ as recipes_init
from draftsmith.runtime.display import table

RECIPES = Path(recipes_init).parent
# family -> (training method, recipe, overrides); None: nothing to train
LINEUP: dict[str, tuple[str, str, list[str]] | None] = {
    "eagle3": ("eagle", "eagle/eagle3_tiny.yaml", []),
    "eagle1": (
        "eagle",
        "eagle/eagle1_toy.yaml",
        ["train.max_steps=150", "checkpoint.every=0", "eval.every=0"],
    ),
    "medusa": ("medusa", "medusa/tiny.yaml", []),
    "dflash": ("dflash", "dflash/tiny.yaml", []),
    "peagle": ("peagle", "peagle/tiny.yaml", []),
    "draft_lm": (
        "distill",
        "distill/toy.yaml",
        ["train.max_steps=150", "data.max_samples=400", "checkpoint.every=0", "eval.every=0"],
    ),
    "mtp": ("mtp", "mtp/toy.yaml", ["train.max_steps=20", "checkpoint.every=0", "eval.every=0"]),
    "ngram": None,
}
# families drafted as deep as they were trained (Medusa's heads, DFlash's block - 1, P-EAGLE's depths): the
# evaluator's default depth, which engine-eval gives vLLM as num_speculative_tokens
AS_TRAINED = {"medusa", "dflash", "peagle"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftsmith.scripts.cli", *args]


def train(name: str, target: Path, out: Path) -> Path:
    entry = LINEUP[name]
    assert entry is not None
    method, recipe, overrides = entry
    run = out / name
    final = run / "final"
    if not final.is_dir():
        cmd = cli(
            "train", method, "--config", str(RECIPES / recipe), f"target.path={target}", f"output_dir={run}"
        )
        subprocess.run([*cmd, *overrides, "--resume"], check=True, capture_output=True, text=True)
    return final


def measure(name: str, drafter: str, target: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"{name}-T{args.temperature:g}-{args.draft_sample_method}"
    report = out / f"{tag}.json"
    cmd = cli(
        *("engine-eval", "--engine", "vllm", "--target", str(target), "--drafter", drafter),
        *("--data", args.data, "--num-prompts", str(args.num_prompts)),
        *("--max-new-tokens", str(args.max_new_tokens)),
        *(() if name in AS_TRAINED else ("--depth", str(args.depth))),
        *("--temperature", str(args.temperature), "--draft-sample-method", args.draft_sample_method),
        *("--report", str(report), "--work-dir", str(out / "work" / tag), "--no-progress"),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if not report.is_file():
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        return {"name": name, "error": lines[-1] if lines else f"exit {proc.returncode}"}
    return {"name": name, **json.loads(report.read_text())}


HEADER = (
    "family",
    "vLLM method",
    "tau vLLM",
    "tau draftsmith",
    "difference",
    "counted alike",
    "acceptance by position, vLLM",
    "draftsmith",
    "spec = plain in vLLM",
    "speedup vLLM",
    "speedup draftsmith",
)


def measured_cells(r: dict[str, Any]) -> list[str]:
    """One family's cells: both engines' tau and their differences, acceptance, lossless check, speedups."""
    v, d = r["vllm"], r["draftsmith"]
    rel, same = r["tau_relative_difference"], d["vllm_definition"]["mean_acceptance_length"]
    alike = (v["mean_acceptance_length"] - same) / same if same and v["mean_acceptance_length"] else None
    equal = (
        "-" if v["speculative_equals_plain"] is None else f"{v['speculative_equals_plain']}/{r['answers']}"
    )
    return [
        r["name"],
        r["engine"]["speculative_config"]["method"],
        cell(v["mean_acceptance_length"]),
        cell(d["tau"]),
        f"{cell(rel * 100 if rel is not None else None, 2)} %",
        f"{cell(alike * 100 if alike is not None else None, 2)} %",
        cell(v["acceptance_by_position"]),
        cell(d["vllm_definition"]["acceptance_by_position"]),
        equal,
        cell(v["speedup"], 2),
        cell(d["speedup"], 2),
    ]


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table, one row per family; a refused or failed family's reason fills its row."""
    cells = [
        [r["name"], "refused: " + r["error"].removeprefix("error: "), *[""] * (len(HEADER) - 2)]
        if "error" in r
        else measured_cells(r)
        for r in rows
    ]
    return "\n".join(table(HEADER, cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, default=None, help="default: the tiny toy target (built once)")
    p.add_argument("--out", type=Path, default=Path("runs/engine-sweep"))
    p.add_argument("--only", default=None, help="comma-separated families (default: all)")
    p.add_argument("--data", default="stdlib:heldout")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--draft-sample-method", choices=("greedy", "probabilistic"), default="greedy")
    p.add_argument(
        "--table-only", action="store_true", help="print the table of the reports already in --out"
    )
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(LINEUP)
    suffix = f"T{args.temperature:g}-{args.draft_sample_method}"
    if args.table_only:
        found = [args.out / f"{n}-{suffix}.json" for n in names]
        print(
            sweep_table(
                [{"name": f.name.split("-T")[0], **json.loads(f.read_text())} for f in found if f.is_file()]
            )
        )
        return 0
    target = args.target
    if target is None:
        from draftsmith.toy.build import default_target_dir
        from draftsmith.toy.target import build_toy_target

        target = default_target_dir("tiny")
        if not (target / "build.json").is_file():
            build_toy_target("tiny", target, seed=0, force=True, progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        print(f"{name}: training" if LINEUP[name] else f"{name}: nothing to train", flush=True)
        try:
            drafter = "ngram" if LINEUP[name] is None else str(train(name, target, args.out))
        except subprocess.CalledProcessError as err:
            rows.append({"name": name, "error": f"training failed: {err.stderr.strip().splitlines()[-1:]}"})
            continue
        print(f"{name}: engine-eval", flush=True)
        rows.append(measure(name, drafter, target, args.out, args))
    text = sweep_table(rows)
    (args.out / f"table-{suffix}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
