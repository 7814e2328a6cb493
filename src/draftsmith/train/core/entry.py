"""What every `train/<method>.py` main does around its method: parse the recipe, load the target and data
(or an offline feature cache), shard the target like the drafter's engine, run the loop, save `final/`.
The method script supplies how to build its drafter, which target layers it reads, and how to report."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import yaml
from accelerate import Accelerator
from accelerate.utils import set_seed

from draftsmith.config.cli import make_parser, parse_args
from draftsmith.config.save import config_yaml
from draftsmith.models.identity import check_target_identity
from draftsmith.models.serving import unserved_reason
from draftsmith.models.target import FrozenTarget
from draftsmith.runtime.errors import DiskFull, disk_fault, require_space
from draftsmith.runtime.files import read_json
from draftsmith.runtime.run_lock import main_process_lock
from draftsmith.train.cache.store import FeatureCache

from .checkpointing import trainable_bytes
from .data import DataBundle, DataConfig, build_datasets, load_cached_datasets
from .data_content import CONTENT_KEY, data_hashes, source_hashes
from .distributed import make_accelerator, shard_frozen_target, shard_kind
from .loop import run_training
from .method import LoopResult, TrainingMethod
from .recipe import ConfigT, Recipe


def train_main(recipe: Recipe[ConfigT], argv: Sequence[str] | None) -> int:
    """Train the drafter of `recipe` as its config says (`--config FILE` and `a.b=c` overrides in `argv`).

    Writes the run directory (checkpoints, metrics.jsonl) and `final/` with the held-out metrics (through the
    method's `save_final`), and prints the method's `report` on the main process.
    """
    parser = make_parser(recipe.config, prog=recipe.prog, description=recipe.description)
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CKPT",
        help="Continue a run: from the newest intact checkpoint in output_dir, or from CKPT.",
    )
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="Allow --resume from a checkpoint holding pickle files (FSDP / DeepSpeed runs, or draftsmith before "
        "0.2): loading a pickle can run code, so only for checkpoints you wrote.",
    )
    cfg, args = parse_args(recipe.config, parser, resume_before_overrides(argv))
    output_dir = Path(cfg.output_dir)
    accelerator = make_accelerator(
        cfg.train.mixed_precision,
        cfg.train.grad_accum,
        "wandb" if cfg.log.wandb else None,
        output_dir,
        compile=cfg.train.compile,
    )
    set_seed(cfg.seed)
    # One writer per run directory: a second training (or a --resume while this one runs) is refused.
    with main_process_lock(output_dir, "training", accelerator.is_main_process):
        explicit = {o.partition("=")[0] for o in args.overrides}  # the keys the command line set
        code = _train(cfg, recipe, args.resume, args.trust_pickle, accelerator, output_dir, explicit)
    # Free the prepared models (a DDP wrapper's reducer holds gloo's process group and its threads) while the
    # interpreter is whole. Left to the collection at exit, a 2-process CPU run aborted now and then after
    # finishing ("terminate called without an active exception", SIGABRT on rank 1): the mechanism of PyTorch's
    # c10d atexit discussion (pytorch#179291).
    accelerator.free_memory()
    del accelerator
    gc.collect()
    return code


def resume_before_overrides(argv: Sequence[str] | None) -> list[str]:
    """`--resume train.lr=1e-4` meant "resume the latest checkpoint, with this override": argparse would take
    the override as the checkpoint path. A `--resume` value that holds `=` and is no existing path is read so."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if arg == "--resume" and "=" in nxt and not Path(nxt).exists():
            out.append("--resume=latest")
            continue
        out.append(arg)
    return out


def _train(
    cfg: ConfigT,
    recipe: Recipe[ConfigT],
    resume: str | None,
    trust_pickle: bool,
    accelerator: Accelerator,
    output_dir: Path,
    explicit: Collection[str] = (),
) -> int:
    """`train_main` past parsing, with the run directory locked."""
    target, data = _load_target_and_data(cfg, recipe, accelerator, explicit)
    method = recipe.build_method(cfg, target, data)  # before sharding: drafters may copy target weights
    method.loss_chunk = cfg.train.loss_chunk_tokens
    check_served(method, target, cfg.train.allow_unserved)
    method.model.to(accelerator.device)
    _shard_target(method, target, accelerator)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    result = run_training(
        method,
        accelerator=accelerator,
        train_dataset=data.train,
        eval_dataset=data.eval,
        pad_id=pad_id,
        output_dir=output_dir,
        seed=cfg.seed,
        train=cfg.train,
        log=cfg.log,
        checkpoint=cfg.checkpoint,
        eval_cfg=cfg.eval,
        config_yaml=config_yaml(cfg),
        prog=recipe.prog,
        resume=resume,
        trust_pickle=trust_pickle,
        data_sha256=data.content,
    )
    if accelerator.is_main_process:
        summary = {**_summary(cfg, result), CONTENT_KEY: data.content}
        final = _save_final(output_dir, method, target, {"training": summary}, result)
        print(method.report(result))
        print(f"drafter checkpoint: {final}")
    accelerator.wait_for_everyone()
    accelerator.end_training()  # after final/ is written: never inside the loop
    return 0


def _load_target_and_data(
    cfg: ConfigT, recipe: Recipe[ConfigT], accelerator: Accelerator, explicit: Collection[str]
) -> tuple[FrozenTarget, DataBundle]:
    """The frozen target and the train / held-out data: tokenized conversations, or an offline feature cache
    checked against the target and against the content of the data files the recipe names. Either way the
    bundle carries the sha256 of the data files the samples come from (`content`), which the run records."""
    progress = accelerator.is_local_main_process
    content = data_hashes(cfg.data)  # before reading: the record is of the bytes read, or older ones
    if not cfg.data.cache:
        target = FrozenTarget.load(cfg.target, accelerator.device)
        data = build_datasets(cfg.data, target.tokenizer, seed=cfg.seed, progress=progress)
        data.content = content
        return target, data
    # Offline: the cache holds the samples and the target's features; only the target's embedding,
    # final norm and LM head are loaded (the logits are recomputed from the cached `final` state). The run
    # records the data the cache was built from (what it trains on), not the recipe's.
    cfg.data = data_of_cache(cfg.data, explicit)
    content = data_hashes(cfg.data)
    cache = FeatureCache.open(
        str(cfg.data.cache), verify=cfg.data.cache_verify, progress=progress, data=content
    )
    target = FrozenTarget.load(cfg.target, accelerator.device, layers=recipe.offline_target_layers(cfg))
    check_target_identity(cache.index["target"], target.identity(), f"the cache {cache.directory}")
    cache.require_layers(recipe.cache_layers(cfg, target), recipe.prog)
    return target, load_cached_datasets(cache, target.lm_head.weight.dtype, cfg.data.max_samples)


# What a cache fixes of the data when it is built; a run from it can still take a prefix (max_samples) and say
# how to read it (cache, cache_verify).
_RUN_TIME_DATA_KEYS = ("max_samples", "cache", "cache_verify")
_SOURCE_KEYS = ("train", "eval")


def _all_local(sources: list[str]) -> bool:
    """Whether every source is a local file or folder, whose content the cache compares with its own record
    (a copy under another name is the same data; a built-in or Hub source has no content to compare)."""
    return len(source_hashes(sources)) == len(set(sources))


def data_of_cache(data: DataConfig, explicit: Collection[str]) -> DataConfig:
    """The data settings a run from the cache `data.cache` trains with: the cache's own (its sources, max_len,
    format, held-out split: the samples in it were cut by them), so that the resolved config records what was
    trained on. A setting the command line gave that differs from the cache's is one the cache cannot honour:
    refused in one line naming both values; but local data files under other names are left to the cache's
    content check (`FeatureCache.require_data`: the same bytes pass, other bytes are refused naming the file). A cache without a recorded header (or none yet) is left to
    `FeatureCache.open`'s own errors.

    Raises:
        ValueError: `data.KEY=VALUE` on the command line, the cache built with another VALUE.
    """
    index = Path(str(data.cache)).expanduser() / "index.json"
    built = read_json(index).get("data") if index.is_file() else None
    if not isinstance(built, dict):
        return data
    adopted = {}
    for key, value in built.items():
        if key in _RUN_TIME_DATA_KEYS or not hasattr(data, key) or getattr(data, key) == value:
            continue
        if f"data.{key}" in explicit and key in _SOURCE_KEYS and _all_local(getattr(data, key)):
            continue  # files named by their content: the cache checks they are what it was built from
        if f"data.{key}" in explicit:
            raise ValueError(
                f"data.{key}={getattr(data, key)!r}: the cache {data.cache} was built with data.{key}={value!r}, "
                "and its samples cannot be cut again; drop the override, or build a cache with it "
                "(`draftsmith cache METHOD --config RECIPE ... data.cache=NEW_DIR`)"
            )
        adopted[key] = value
    return dataclasses.replace(data, **adopted)


def _shard_target(method: TrainingMethod, target: FrozenTarget, accelerator: Accelerator) -> None:
    """Under FSDP / ZeRO-3, shard the frozen target as the drafter is sharded; refuse the drafters that such
    sharding cannot train."""
    kind = shard_kind(accelerator)
    if kind is None:
        return
    target_params = {id(p) for p in target.model.parameters()}
    if any(id(p) in target_params for p in method.model.parameters()):
        raise ValueError(
            f"this drafter trains parameters inside the target (Medusa-2's adapter), which {kind} would shard "
            "twice; train it under DDP or DeepSpeed ZeRO-1/2 (recipes/accelerate/ddp.yaml or zero2.yaml)"
        )
    if method.generates:
        raise ValueError(
            f"on-policy distillation generates with the draft on each rank independently, which a {kind}-sharded "
            "draft cannot do (its forwards are collectives); set distill.on_policy=0 or launch with ddp.yaml / zero2.yaml"
        )
    if target.has_layers:
        shard_frozen_target(target.model, kind, accelerator.device.type)
        target.sharded = True


def _summary(cfg: ConfigT, result: LoopResult) -> dict[str, Any]:
    """What final/ records of the training: steps, held-out metrics at the start and end, the last train
    metrics and the resolved recipe."""
    return {
        "steps": result.step,
        "heldout": result.eval,
        "heldout_at_start": result.initial_eval,
        "train": result.last_train,
        **({"selection": result.selection} if result.selection else {}),
        "recipe": yaml.safe_load(config_yaml(cfg)),  # the resolved recipe (the Hub card shows it)
    }


def _save_final(
    output_dir: Path,
    method: TrainingMethod,
    target: FrozenTarget,
    extra: dict[str, Any],
    result: LoopResult,
) -> Path:
    """Write `final/` (main process), after checking the disk can hold it. A full or read-only disk is one line
    saying that the last checkpoint holds the trained drafter and `--resume` writes `final/` from it."""
    try:
        weights = result.state_dict
        needed = (
            sum(t.numel() * t.element_size() for t in weights.values())
            if weights
            else trainable_bytes(method.model)
        )
        require_space(output_dir, needed + 1_000_000, "final/")
        return method.save_final(output_dir / "final", target, extra, weights)
    except Exception as err:
        message = str(err) if isinstance(err, DiskFull) else disk_fault(err)
        if message is None:
            raise
        raise DiskFull(
            f"writing final/ failed: {message}; checkpoint-{result.step} holds the trained drafter: fix the disk "
            "and run the same command with --resume to write final/ from it"
        ) from err


def check_served(method: TrainingMethod, target: FrozenTarget, allow_unserved: bool) -> None:
    """Before the first step: refuse a drafter no serving engine loads for this target, in one line naming
    which engines serve what, unless the recipe asks for one anyway (`train.allow_unserved`: a drafter for
    draftsmith's own evaluator)."""
    reason = unserved_reason(method.kind, target.model.config)
    if reason is None:
        return
    if not allow_unserved:
        raise ValueError(
            f"{reason}. Set train.allow_unserved=true to train it for draftsmith's evaluator only, or pick a "
            "drafter kind an engine serves for this target"
        )
    print(f"note: {reason}; training it for draftsmith's evaluator only (train.allow_unserved=true)")
