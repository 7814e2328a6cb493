r"""Rivals at one scaling point: the peers' EAGLE-3 (NVIDIA ModelOpt, vLLM speculators) and other draftsmith
families trained on exactly the samples and steps of a `bench.scaling` run (docs/BENCHMARKS.md, "Rivals on the
same samples and steps").

    python -m bench.scaling_rivals --run OUT/train/tokens-728876 --out RIVALS \
        [--modelopt-python PY] [--speculators-python PY] [--families draft_lm,mtp]
    python -m bench.scaling --target DIR --mix MIX --cache CACHE --out OUT --sizes all --sets gsm8k \
        --drafter modelopt=RIVALS/modelopt-converted@TOKENS --drafter draft_lm=RIVALS/draft_lm/final@TOKENS ...

The run's resolved config.yaml gives everything: the target, the answers and the settings its cache was built
by (so `build_datasets` yields the same samples with the same seed; the data files' sha256 and the samples'
count and token total are checked against the cache, and a `data.max_samples` run takes the cache's first
samples as it did), the batch, learning rate, warm-up, TTT depth and draft vocabulary, and the run's own
metrics.jsonl its number of optimizer steps. Every rival gets those samples and steps at that batch:
- the peers through bench/bench_peers.py's drivers (their own venvs; the install lines are in that file's
  docstring), each converted to a draftsmith checkpoint by bench/convert_peers.py. ModelOpt pads every sample to
  one length, here the longest sample's (no sample is cut);
- the families by their SmolLM2 recipes (bench/real_target.py's FAMILIES) with the run's max_len, learning
  rate and warm-up, trained online (the target runs inside each step; the run's cache holds EAGLE-3's taps
  only) from the run's own records (RIVALS/train.records.jsonl, the held-out ones as their eval set), checked
  to render to the same tokens.
Each part is kept when finished; rerunning continues. The evaluation is `bench.scaling`'s, so every drafter is
measured by the same prompts, depth and plain run as the scaling point itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.real_target import FAMILIES, cli, run, train_converted_peers

REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.scaling_rivals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", type=Path, required=True, help="a bench.scaling run: OUT/train/tokens-N")
    p.add_argument("--out", type=Path, required=True, help="where the rivals are trained")
    p.add_argument(
        "--modelopt-python", default=None, help="the ModelOpt venv's python (bench/bench_peers.py)"
    )
    p.add_argument(
        "--speculators-python", default=None, help="the speculators venv's python (AdamW, classic)"
    )
    p.add_argument(
        "--families",
        default="draft_lm,mtp",
        help=f"draftsmith families to train alike, comma-separated, from {','.join(f for f in FAMILIES if f != 'eagle3')} "
        "(default draft_lm,mtp: the two ahead of EAGLE-3 at one budget in 'A real target'); '' for none",
    )
    return p


def run_steps(run_dir: Path) -> int:
    """The optimizer steps the run took (its metrics.jsonl's last step)."""
    steps = [json.loads(line).get("step", 0) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if not steps:
        raise SystemExit(f"{run_dir}/metrics.jsonl holds no step: is the run finished?")
    return max(steps)


def export_samples(recipe: Any, model: Any, out: Path) -> tuple[Path, int, int, int, Any]:
    """The run's training samples as JSONL {input_ids, loss_mask}: (path, samples, tokens, longest, the
    `build_datasets` bundle they are the first of).

    The same `build_datasets` call as the run's (the settings its cache was built by, its seed), checked against
    the cache: the data files' recorded sha256, the number of samples and of tokens, or the rivals would not see
    the run's data.
    """
    from draftsmith.train.cache.store import CacheError, FeatureCache
    from draftsmith.train.core.data import DataConfig, build_datasets, sample_lengths
    from draftsmith.train.core.data_content import data_hashes

    d = recipe.data
    # a cached run's data.max_samples takes the cache's first samples; the cache was built from its own settings
    built = json.loads((Path(d.cache) / "settings.json").read_text())["data"] if d.cache else None
    source = built or {
        "train": d.train,
        "eval": d.eval,
        "eval_fraction": d.eval_fraction,
        "max_len": d.max_len,
        "max_samples": d.max_samples,
    }
    config = DataConfig(
        train=list(source["train"]),
        eval=list(source["eval"]),
        eval_fraction=source["eval_fraction"],
        max_len=source["max_len"],
        max_samples=source["max_samples"],
    )
    data = build_datasets(config, model.tokenizer, seed=recipe.seed, progress=False)
    count = min(len(data.train), d.max_samples) if built and d.max_samples else len(data.train)
    path = out / "train.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    tokens, longest = 0, 0
    with path.open("w") as f:
        for i in range(count):
            s = data.train[i]
            ids, mask = [int(t) for t in s["input_ids"]], [int(m) for m in s["loss_mask"]]
            tokens, longest = tokens + len(ids), max(longest, len(ids))
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    if built:
        cache = FeatureCache.open(d.cache, verify=False)
        try:
            cache.require_data(data_hashes(config))  # the files' sha256 against those the cache recorded
        except CacheError as e:
            raise SystemExit(f"{e}: the rivals would not see the run's data") from None
        cached = sample_lengths(cache.dataset("train").tokens_only())[:count]
        if (len(cached), sum(cached)) != (count, tokens):
            raise SystemExit(
                f"the samples rebuilt from {source['train']} ({count}, {tokens:,} tokens) are not the run's "
                f"cache's ({len(cached)}, {sum(cached):,}): the data or its settings changed since the run"
            )
    return path, count, tokens, longest, data


def source_records(data: Any, count: int, out: Path) -> tuple[Path, Path | None]:
    """The run's first `count` training conversations and its held-out ones, as their original JSONL records
    (train.records.jsonl, heldout.records.jsonl; None without held-out ones), for a family's own data loader.

    Each sample names its record (`"<file>:<index>"`, the index counting the file's non-empty lines). The
    family's loader renders them again; the caller checks that it gets the same tokens.
    """
    files: dict[str, list[str]] = {}
    written: list[Path | None] = []
    for name, sources in (("train", data.train.sources[:count]), ("heldout", data.eval.sources)):
        if not sources:
            written.append(None)
            continue
        path = out / f"{name}.records.jsonl"
        with path.open("w") as f:
            for source in sources:
                file, _, index = source.rpartition(":")
                if not file.endswith(".jsonl"):
                    raise SystemExit(f"{source}: --families needs JSON Lines data (the scaling mixes are)")
                if file not in files:
                    files[file] = [line for line in Path(file).read_text().split("\n") if line.strip()]
                f.write(files[file][int(index)] + "\n")
        written.append(path)
    assert written[0] is not None  # a run trains on at least one sample
    return written[0], written[1]


def check_records(records: Path, heldout: Path | None, samples: Path, recipe: Any, model: Any) -> None:
    """Refuse unless the family's loader, given the records, renders exactly the exported samples."""
    from draftsmith.train.core.data import DataConfig, build_datasets

    config = DataConfig(
        train=[str(records)],
        eval=[str(heldout)] if heldout else [],
        eval_fraction=0.0,
        max_len=recipe.data.max_len,
    )
    again = build_datasets(config, model.tokenizer, seed=recipe.seed, progress=False).train
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    same = len(again) == len(rows) and all(
        again[i]["input_ids"].tolist() == row["input_ids"] for i, row in enumerate(rows)
    )
    if not same:
        raise SystemExit(
            f"{records}: its records render to other samples than the run's; the families would differ"
        )


def train_family(
    args: argparse.Namespace, recipe: Any, family: str, steps: int, data: tuple[Path, Path | None]
) -> None:
    method, rel = FAMILIES[family]
    run_dir = args.out / family
    if (run_dir / "final").is_dir():
        return
    print(f"[train] {family}: {rel}, {steps} steps of {recipe.train.micro_batch_size}", flush=True)
    t0 = time.perf_counter()
    cmd = cli(
        *("train", method, "--config", str(REPO / "recipes" / rel), f"target.path={recipe.target.path}"),
        *(f"data.train=[{data[0]}]", f"data.eval=[{data[1] or ''}]", "data.eval_fraction=0"),
        f"data.max_len={recipe.data.max_len}",
        *("data.max_samples=null", f"train.max_steps={steps}", f"train.lr={recipe.train.lr}"),
        *(
            f"train.micro_batch_size={recipe.train.micro_batch_size}",
            f"train.warmup_ratio={recipe.train.warmup_ratio}",
        ),
        *(f"output_dir={run_dir}", "--resume"),
    )
    run(cmd, args.out / "logs" / f"train-{family}.log")
    (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    if unknown := [f for f in families if f not in FAMILIES or f == "eagle3"]:
        parser.error(
            f"--families: no family {', '.join(unknown)}; choose from {', '.join(FAMILIES)} but eagle3"
        )
    if not (args.run / "config.yaml").is_file():
        parser.error(f"--run {args.run}: no config.yaml; give a bench.scaling run, OUT/train/tokens-N")

    from draftsmith.config.loader import load_config
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train.eagle import RECIPE

    recipe = load_config(RECIPE, args.run / "config.yaml")
    steps = run_steps(args.run)
    model = FrozenTarget.load(TargetConfig(path=recipe.target.path, dtype="float32"))
    samples, n, tokens, longest, data = export_samples(recipe, model, args.out)
    print(
        f"[data] {n:,} samples, {tokens:,} tokens (the run's), longest {longest}; {steps} steps", flush=True
    )
    if families:
        records = source_records(data, n, args.out)
        check_records(*records, samples, recipe, model)
    pythons = {"modelopt": args.modelopt_python, "speculators": args.speculators_python}
    train_converted_peers(pythons, model, samples, args.out, args.out / "logs", steps, longest, recipe)
    for family in families:
        train_family(args, recipe, family, steps, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
