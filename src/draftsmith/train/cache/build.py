"""`draftsmith cache METHOD`: run the target once over a recipe's data and store what its drafter reads.

    draftsmith cache eagle --config recipes/eagle/eagle3_toy.yaml target.path=DIR data.cache=CACHE [--storage fp8]
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m draftsmith.train.cache.build \\
        eagle --config ... data.cache=CACHE                     (shards split across the processes)
    draftsmith train eagle --config recipes/eagle/eagle3_toy.yaml target.path=DIR data.cache=CACHE

The recipe is the one training will use: its data section decides the samples (train and eval splits,
rendered and truncated exactly as online training would) and its drafter decides the layers (EAGLE-3: its
three taps and `final`; EAGLE-1, Medusa-1 and distillation: `final`; MTP: the last residual stream and
`final`). `final` replaces full-vocabulary logits: training recomputes them through the frozen LM head.

Shards are written atomically with a sidecar that records their sha256, so a killed run resumes by
running the same command: complete, intact shards are kept and the rest are (re)written; the cache records the
sha256 of every local data file it reads, so a file edited since is refused, never mixed with the old shards
(training from the cache checks the recipe's data files the same way). Storage is
bf16 or fp8 (e4m3, one scale per hidden channel and shard): about half the bytes.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import torch
from tqdm.auto import tqdm

from draftsmith.config.cli import make_parser, parse_args
from draftsmith.config.save import config_to_dict
from draftsmith.models.target import FrozenTarget, LayerId
from draftsmith.runtime.errors import run_main
from draftsmith.runtime.files import write_json
from draftsmith.runtime.run_lock import main_process_lock
from draftsmith.train.cache.store import (
    Storage,
    completed_entry,
    plan_shards,
    shard_name,
    write_index,
    write_shard,
)
from draftsmith.train.core.data import build_datasets, collate
from draftsmith.train.core.data_content import CONTENT_KEY, content_change, data_hashes
from draftsmith.train.methods import TRAIN_METHODS

SETTINGS_NAME = "settings.json"  # the header, written first: a resumed build must use the same settings
# 65,536 tokens: for 4 layers of H = 4096, a 2 GiB bf16 shard, built in 4 GiB of float32 host memory.
DEFAULT_SHARD_TOKENS = 1 << 16


@torch.no_grad()
def target_features(
    target: FrozenTarget, samples: list[dict[str, torch.Tensor]], layers: Sequence[LayerId], pad_id: int
) -> dict[LayerId, list[torch.Tensor]]:
    """Run the target on `samples` (one padded batch) and return each layer's `[T_i, H]` rows per sample."""
    batch = {k: v.to(target.device) for k, v in collate(samples, pad_id).items()}
    feats, _ = target.forward(batch["input_ids"], batch["attention_mask"], layer_ids=layers)
    lengths = [len(s["input_ids"]) for s in samples]
    # Features to float32 for the storage codec; `top1` token ids stay integers.
    return {
        lid: [(f[i, :n].float() if f.is_floating_point() else f[i, :n]).cpu() for i, n in enumerate(lengths)]
        for lid, f in feats.items()
    }


def shard_features(
    target: FrozenTarget,
    samples: list[dict[str, torch.Tensor]],
    layers: Sequence[LayerId],
    pad_id: int,
    batch_size: int,
    advance: Callable[[int], Any] = lambda n: None,
) -> dict[LayerId, list[torch.Tensor]]:
    """Each layer's rows for every sample of a shard, in the samples' order. The target runs on batches of
    samples of similar length (sorted by length): a shuffled mix batched as it comes pads every row to the
    longest of the batch (measured: 2.5x the tokens actually run on a mix of chats and 500-token documents)."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["input_ids"]))
    rows: dict[LayerId, list[torch.Tensor | None]] = {lid: [None] * len(samples) for lid in layers}
    for i in range(0, len(order), batch_size):
        picked = order[i : i + batch_size]
        for lid, feats in target_features(target, [samples[k] for k in picked], layers, pad_id).items():
            for k, f in zip(picked, feats, strict=True):
                rows[lid][k] = f
        advance(len(picked))
    return {lid: [f for f in fs if f is not None] for lid, fs in rows.items()}


def build_cache(
    method: str,
    cfg: Any,
    storage: Storage,
    shard_tokens: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    rank: int = 0,
    world: int = 1,
    progress: bool = True,
) -> list[tuple[str, int]]:
    """Write this process's shards (every `world`-th, from `rank`) of the cache in `cfg.data.cache`.

    Returns the `(split, shard number)` of every planned shard, for the index.
    """
    out = Path(cfg.data.cache).expanduser()
    content = data_hashes(cfg.data)
    _check_same_content(out, content)  # before loading anything: an edited data file is refused at once
    out.mkdir(parents=True, exist_ok=True)
    target = FrozenTarget.load(cfg.target, device)
    module = importlib.import_module(TRAIN_METHODS[method])
    layers = module.cache_layers(cfg, target)
    target.check_layer_ids(layers)
    data = build_datasets(cfg.data, target.tokenizer, seed=cfg.seed, progress=progress)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    header = {
        "method": method,
        "target": target.identity(),
        "layers": [str(lid) for lid in layers],
        "storage": storage,
        "hidden_size": target.hidden_size,
        "shard_tokens": shard_tokens,
        "data": {k: v for k, v in config_to_dict(cfg.data).items() if k not in ("cache", "cache_verify")},
        CONTENT_KEY: content,  # the sha256 of each local data file (train/core/data_content.py)
        "seed": cfg.seed,
    }
    _check_same_settings(out, header)
    if rank == 0:
        write_json(out / SETTINGS_NAME, header)  # atomic: the other processes may be reading it
    planned: list[tuple[str, int]] = []
    work = []
    for split, dataset in (("train", data.train), ("eval", data.eval)):
        for number, (start, end) in enumerate(plan_shards(dataset.lengths, shard_tokens)):
            planned.append((split, number))
            if (len(planned) - 1) % world == rank:
                work.append((split, number, dataset, start, end))
    mine = sum(end - start for *_, start, end in work)
    bar = tqdm(total=mine, desc=f"cache (rank {rank})", unit="sample", disable=not progress)
    for split, number, dataset, start, end in work:
        name = shard_name(split, number)
        if completed_entry(out, name) is not None:  # done by an earlier, interrupted run
            bar.update(end - start)
            continue
        samples = [dataset[i] for i in range(start, end)]
        features = shard_features(target, samples, layers, pad_id, batch_size, bar.update)
        write_shard(out, name, samples, features, storage, first_sample=start)
    bar.close()
    return planned


def _check_same_settings(out: Path, header: dict[str, Any]) -> None:
    """Refuse to resume into a directory that was started with other settings or from data whose content has
    changed since (mixed shards, or shards of the old data kept as if they were of the new)."""
    path = out / SETTINGS_NAME
    if not path.is_file():
        return
    before = json.loads(path.read_text())
    diff = [k for k in header if k != CONTENT_KEY and before.get(k) != header[k]]
    if diff:
        raise ValueError(
            f"{out} holds a cache built with other settings ({', '.join(diff)} differ); "
            "choose another data.cache directory or delete this one"
        )
    _check_same_content(out, header[CONTENT_KEY])


def _check_same_content(out: Path, content: dict[str, str]) -> None:
    """Refuse to build into a directory whose shards were made from data with other content (a data file edited
    in place since): one line naming the file. A header written before content was recorded is not compared."""
    path = out / SETTINGS_NAME
    if not path.is_file():
        return
    change = content_change(json.loads(path.read_text()).get(CONTENT_KEY), content)
    if change:
        raise ValueError(
            f"{out} holds a cache built from data whose content has changed since: {change}; "
            "choose another data.cache directory or delete this one"
        )


def finish_index(out: Path, header_from: Path, planned: list[tuple[str, int]]) -> Path:
    """Assemble `index.json` once every shard exists (called by the main process after the others)."""
    header = json.loads(header_from.read_text())
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for split, number in planned:
        entry = completed_entry(out, shard_name(split, number))
        if entry is None:
            raise RuntimeError(
                f"cache shard {shard_name(split, number)} is missing after every process finished"
            )
        splits[split].append(entry)
    return write_index(out, header, splits)


def summary(index_path: Path) -> str:
    index = json.loads(index_path.read_text())
    lines = [f"cache: {index_path.parent}  ({index['storage']}, layers {index['layers']})"]
    for split, info in index["splits"].items():
        per_token = info["feature_bytes"] / max(info["tokens"], 1)
        lines.append(
            f"  {split:<5} {info['samples']:>7,} samples {info['tokens']:>10,} tokens {len(info['shards']):>4} shards "
            f"{info['bytes'] / 2**20:>9.1f} MiB  ({per_token:,.1f} feature bytes/token)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: draftsmith cache METHOD --config RECIPE [KEY=VALUE ...] data.cache=DIR [--storage bf16|fp8]"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print(usage + "\nmethods: " + ", ".join(sorted(TRAIN_METHODS)))
        print("`draftsmith cache METHOD --help` lists the options and every recipe key.")
        return 0 if argv else 2
    if argv[0] not in TRAIN_METHODS:
        print(
            f"{usage}\ndraftsmith cache: unknown method {argv[0]!r}; choose from {', '.join(sorted(TRAIN_METHODS))}"
        )
        return 2
    method, rest = argv[0], argv[1:]
    recipe_cls = importlib.import_module(TRAIN_METHODS[method]).RECIPE
    parser = make_parser(recipe_cls, prog=f"draftsmith cache {method}", description=__doc__ or "")
    parser.add_argument(
        "--storage", choices=get_args(Storage), default="bf16", help="feature dtype on disk (default bf16)"
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens per shard; a shard is built in host memory as float32 (default {DEFAULT_SHARD_TOKENS})",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="samples per target forward (default 8)")
    cfg, args = parse_args(recipe_cls, parser, rest)
    if not cfg.data.cache:
        parser.error(
            "set data.cache=DIR: where to write the cache (training reads it with the same override)"
        )
    if args.shard_tokens < 1 or args.batch_size < 1:
        parser.error("--shard-tokens and --batch-size must be >= 1")

    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # joins the launch's process group, if any
    out = Path(cfg.data.cache).expanduser()
    # One build per cache directory: a second `draftsmith cache` into it is refused while this one runs.
    with main_process_lock(out, "caching", state.is_main_process):
        planned = build_cache(
            method,
            cfg,
            args.storage,
            args.shard_tokens,
            args.batch_size,
            device=state.device,
            rank=state.process_index,
            world=state.num_processes,
            progress=state.is_local_main_process,
        )
        state.wait_for_everyone()
        if state.is_main_process:
            index = finish_index(out, out / SETTINGS_NAME, planned)
            print(summary(index))
            print(f"train from it with: draftsmith train {method} --config ... data.cache={out}")
        state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
