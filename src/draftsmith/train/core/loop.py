"""The one training loop, on `accelerate.Accelerator`, shared by every drafter recipe.

A recipe supplies a `TrainingMethod` (method.py): the trainable module, how many loss tokens each loss term
has in a batch (known before the forward pass), and a forward that returns per-term loss sums. The loop normalises each
term by its token count over the whole accumulation window on all ranks, so an optimizer step computes the
same update for any split into ranks x micro-batches x accumulation (DESIGN.md section 3).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedType
from accelerate.logging import get_logger
from torch import nn
from tqdm.auto import tqdm

from draftsmith.runtime.errors import require_space

from .checkpointing import (
    all_ranks,
    checkpoint_format,
    estimate_checkpoint_bytes,
    read_trainer_state,
    resolve_resume,
    save_checkpoint,
    trainable_bytes,
)
from .data import collate, sample_lengths
from .distributed import configure_deepspeed, shard_kind
from .finite import check_finite
from .method import TrainingMethod
from .metrics import MetricsLog, MetricWindow, read_metrics
from .sampler import StepSchedule
from .schedule import cosine_with_warmup, from_step
from .settings import CheckpointConfig, EvalConfig, LogConfig, TrainConfig
from .train_state import FORMAT as STATE_FORMAT
from .train_state import load_training_state

logger = get_logger(__name__)


@dataclass
class LoopResult:
    step: int
    last_train: dict[str, float]
    eval: dict[str, float]
    initial_eval: dict[str, float]  # held-out metrics before the first step (empty when resumed)
    # The drafter's full weights gathered from FSDP / ZeRO-3 (main process), whose unwrapped module holds
    # only this rank's shards; None when the unwrapped module holds them (single, DDP, ZeRO-1/2).
    state_dict: dict[str, torch.Tensor] | None = None


def _batches(dataset: Any, indices: list[list[int]], pad_id: int, device: torch.device) -> Iterator[dict]:
    for idx in indices:
        yield {k: v.to(device) for k, v in collate([dataset[i] for i in idx], pad_id).items()}


@torch.no_grad()
def evaluate(
    method: TrainingMethod,
    model: nn.Module,
    dataset: Any,
    pad_id: int,
    accelerator: Accelerator,
    micro_batch_size: int,
) -> dict[str, float]:
    """Teacher-forced held-out metrics (loss and per-term metrics), averaged over all ranks' shards."""
    if dataset is None or len(dataset) == 0:
        return {}
    model.eval()
    window = MetricWindow(method.term_names, method.term_weights)
    shard = list(range(accelerator.process_index, len(dataset), accelerator.num_processes))
    chunks = [shard[i : i + micro_batch_size] for i in range(0, len(shard), micro_batch_size)]
    # Every rank runs the same number of forwards (DDP/FSDP collectives must line up); extra ones are empty.
    n_chunks = int(accelerator.gather(torch.tensor([len(chunks)], device=accelerator.device)).max())
    for i in range(n_chunks):
        # A rank whose shard ran out repeats a forward with zero weight, so that the collectives of
        # sharded models line up and every rank holds the same metric keys for the reduction.
        real = i < len(chunks)
        batch = next(_batches(dataset, [chunks[i] if real else [0]], pad_id, accelerator.device))
        with accelerator.autocast():
            sums, metrics = method.loss_terms(model, batch)
        w = 1.0 if real else 0.0
        counts = method.token_counts(batch).to(sums.device)
        window.add(sums * w, counts * w, {k: v * w for k, v in metrics.items()})
    model.train()
    return with_derived(method, window.reduce(accelerator, "eval"), "eval")


def with_derived(method: TrainingMethod, record: dict[str, float], prefix: str) -> dict[str, float]:
    """`record` plus the method's derived metrics (e.g. EAGLE's simulated tau)."""
    return {**record, **method.derived_metrics(record, prefix)} if record else record


@dataclass
class _Run:
    """What the steps of one run share."""

    accelerator: Accelerator
    method: TrainingMethod
    model: Any  # method.model as accelerate prepared it
    optimizer: Any
    scheduler: Any
    schedule: StepSchedule
    total_steps: int
    sharded: bool  # FSDP / DeepSpeed: accelerate writes and reads the state (pickles)
    train: TrainConfig
    output_dir: Path
    term_weights: torch.Tensor  # method.term_weights on the device, moved once


def run_training(
    method: TrainingMethod,
    *,
    accelerator: Accelerator,
    train_dataset: Any,
    eval_dataset: Any,
    pad_id: int,
    output_dir: Path,
    seed: int,
    train: TrainConfig,
    log: LogConfig,
    checkpoint: CheckpointConfig,
    eval_cfg: EvalConfig,
    config_yaml: str,
    resume: str | None = None,
    trust_pickle: bool = False,
) -> LoopResult:
    """Train `method.model` and return the final step, last logged train metrics and held-out metrics.

    `config_yaml` (the resolved recipe config) is saved in the run directory and every checkpoint.
    `trust_pickle`: resume from a checkpoint holding pickle files (see checkpointing.resolve_resume).
    """
    resume_from = _prepare_directory(accelerator, method, output_dir, resume, trust_pickle)
    run, trainable = _build(method, accelerator, train, log, config_yaml, output_dir, train_dataset, seed)
    step = _resume(run, resume_from, len(train_dataset)) if resume_from is not None else 0
    if accelerator.is_main_process:
        (output_dir / "config.yaml").write_text(config_yaml)

    def trainer_state() -> dict[str, Any]:
        return {
            "step": step,
            "epoch": run.schedule.epoch_of(step),
            "total_steps": run.total_steps,
            "samples_per_step": run.schedule.samples_per_step,
            "num_train_samples": len(train_dataset),
            "seed": seed,
            "num_processes": accelerator.num_processes,
            "trainable_parameters": trainable,
        }

    def save() -> None:
        save_checkpoint(
            accelerator,
            output_dir,
            step,
            trainer_state(),
            config_yaml,
            checkpoint.keep_last,
            run.model,
            run.optimizer,
            run.scheduler,
            run.sharded,
        )

    def held_out() -> dict[str, float]:
        return evaluate(method, run.model, eval_dataset, pad_id, accelerator, eval_cfg.micro_batch_size)

    metrics_log = MetricsLog(accelerator, output_dir)
    initial_eval: dict[str, float] = {}
    if step == 0:  # the starting point, so every run shows how far training moved the held-out metrics
        initial_eval = held_out()
        if initial_eval:
            metrics_log.write(0, initial_eval)
    window = MetricWindow(method.term_names, method.term_weights)
    last_train: dict[str, float] = {}
    last_saved = step
    run.model.train()
    bar = tqdm(
        total=run.total_steps, initial=step, desc="train", disable=not accelerator.is_local_main_process
    )
    t_window, tokens_window = time.perf_counter(), torch.zeros((), device=accelerator.device)
    while step < run.total_steps:
        batches = list(
            _batches(
                train_dataset,
                run.schedule.micro_batches(step, accelerator.process_index),
                pad_id,
                accelerator.device,
            )
        )
        tokens_window += _optimizer_step(run, step, batches, window)
        step += 1
        bar.update(1)
        if step % log.every == 0 or step == run.total_steps:
            elapsed = time.perf_counter() - t_window
            last_train = _train_record(
                run, window, step, float(accelerator.reduce(tokens_window, "sum")), elapsed
            )
            metrics_log.write(step, last_train)
            bar.set_postfix(loss=f"{last_train['train/loss']:.4f}")
            window.reset()
            t_window, tokens_window = time.perf_counter(), torch.zeros((), device=accelerator.device)
        if eval_cfg.every and step % eval_cfg.every == 0 and step < run.total_steps:
            metrics_log.write(step, held_out())
        if checkpoint.every and step % checkpoint.every == 0:
            save()
            last_saved = step
    bar.close()
    if last_saved != step:
        save()
    eval_metrics = held_out()
    if eval_metrics:
        metrics_log.write(step, eval_metrics)
    # The caller ends the run (`accelerator.end_training()`) after saving: ending it here would tear down
    # the process group, after which every rank believes it is the main process.
    # FSDP / ZeRO-3 leave each rank a shard of the drafter: gather it (a collective: every rank calls it).
    state_dict = accelerator.get_state_dict(run.model) if shard_kind(accelerator) is not None else None
    method.model = accelerator.unwrap_model(run.model)
    return LoopResult(
        step=step, last_train=last_train, eval=eval_metrics, initial_eval=initial_eval, state_dict=state_dict
    )


def _prepare_directory(
    accelerator: Accelerator, method: TrainingMethod, output_dir: Path, resume: str | None, trust_pickle: bool
) -> Path | None:
    """The checkpoint to resume from (None: a fresh run), after checking the disk can hold the run's output."""
    output_dir.mkdir(parents=True, exist_ok=True)
    resume_from, notice = resolve_resume(output_dir, resume, trust_pickle)
    if notice and accelerator.is_main_process:
        print(notice)

    def preflight() -> None:  # hours of training must not end on a disk that cannot hold their result
        if accelerator.is_main_process:
            needed = estimate_checkpoint_bytes(output_dir, method.model) + trainable_bytes(method.model)
            require_space(output_dir, needed, "a checkpoint and final/")

    all_ranks(accelerator, preflight)
    return resume_from


def _build(
    method: TrainingMethod,
    accelerator: Accelerator,
    train: TrainConfig,
    log: LogConfig,
    config_yaml: str,
    output_dir: Path,
    train_dataset: Any,
    seed: int,
) -> tuple[_Run, int]:
    """The step schedule, the optimizer and LR schedule over the method's parameter groups, the model prepared
    by accelerate, and the trackers; returns the run and its number of trainable parameters."""
    schedule = StepSchedule(
        len(train_dataset),
        train.micro_batch_size,
        train.grad_accum,
        accelerator.num_processes,
        seed,
        train.shuffle,
        sample_lengths(train_dataset) if train.group_by_length else None,
    )
    total_steps = train.max_steps or max(1, math.ceil(train.epochs * schedule.steps_per_epoch))
    # A method may split its parameters into groups with their own `lr_scale` and `start_step` (the group
    # stays at lr 0 before it), e.g. Medusa-2's heads-only warm-up and larger head learning rate.
    param_groups: list[dict[str, Any]] = []
    starts: list[int] = []
    for g in method.param_groups():
        params = [p for p in g["params"] if p.requires_grad]
        param_groups.append({"params": params, "lr": train.lr * g.get("lr_scale", 1.0)})
        starts.append(int(g.get("start_step", 0)))
    optimizer = torch.optim.AdamW(
        param_groups, lr=train.lr, betas=train.betas, weight_decay=train.weight_decay
    )
    schedule_fn = cosine_with_warmup(total_steps, round(train.warmup_ratio * total_steps), train.min_lr_ratio)
    # The scheduler is stepped here, not by accelerate: AcceleratedScheduler steps once per process, which
    # would make the schedule depend on the number of processes.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, [from_step(start, schedule_fn) for start in starts]
    )
    configure_deepspeed(accelerator, train.micro_batch_size, train.grad_accum, train.max_grad_norm)
    model, optimizer = accelerator.prepare(method.model, optimizer)
    sharded = shard_kind(accelerator) is not None or accelerator.distributed_type == DistributedType.DEEPSPEED
    if sharded:  # accelerate writes FSDP / DeepSpeed states (pickles), the scheduler with them
        accelerator.register_for_checkpointing(scheduler)
    if log.wandb:
        accelerator.init_trackers(
            log.wandb_project,
            config={"config_yaml": config_yaml},
            init_kwargs={"wandb": {"mode": log.wandb_mode, "dir": str(output_dir), "name": log.run_name}},
        )
    trainable = sum(p.numel() for g in param_groups for p in g["params"])  # all the optimizer updates
    run = _Run(
        accelerator,
        method,
        model,
        optimizer,
        scheduler,
        schedule,
        total_steps,
        sharded,
        train,
        output_dir,
        method.term_weights.to(accelerator.device),
    )
    return run, trainable


def _resume(run: _Run, resume_from: Path, num_samples: int) -> int:
    """Load the state saved in `resume_from` into the run; returns its step."""
    state = read_trainer_state(resume_from)
    if (
        state["samples_per_step"] != run.schedule.samples_per_step
        or state["num_train_samples"] != num_samples
    ):
        raise ValueError(
            f"cannot resume from {resume_from}: it was trained with {state['samples_per_step']} samples per "
            f"step over {state['num_train_samples']} samples, this run has {run.schedule.samples_per_step} over "
            f"{num_samples}; keep micro_batch_size x grad_accum x processes and the data the same"
        )
    accelerator = run.accelerator
    if checkpoint_format(resume_from) == STATE_FORMAT:
        if run.sharded:
            raise ValueError(
                f"{resume_from} was written by a single-process or DDP run; resume it the same way (FSDP / "
                "DeepSpeed keep their own checkpoint format)"
            )
        note = load_training_state(
            resume_from,
            accelerator.unwrap_model(run.model),
            run.optimizer,
            run.scheduler,
            accelerator.process_index,
        )
        if note:
            print(note)
    else:  # accelerate's pickles: allowed by --trust-pickle (resolve_resume checked)
        accelerator.load_state(str(resume_from))
    step = int(state["step"])
    _truncate_metrics(run.output_dir / "metrics.jsonl", step, accelerator, finished=step >= run.total_steps)
    logger.info(f"resumed from {resume_from} at step {step}", main_process_only=True)
    return step


def _optimizer_step(
    run: _Run, step: int, batches: list[dict[str, torch.Tensor]], window: MetricWindow
) -> Any:
    """One optimizer step over the accumulation window `batches` (this rank's micro-batches); returns the
    tokens it read. Refuses the step before applying it if any loss term or the gradient norm is not finite."""
    accelerator, method, model, train = run.accelerator, run.method, run.model, run.train
    batches = [
        method.prepare_batch(model, b, step, j, accelerator.process_index) for j, b in enumerate(batches)
    ]
    batch_counts = [method.token_counts(b).to(accelerator.device) for b in batches]
    global_counts = accelerator.reduce(sum(batch_counts), "sum").clamp(min=1)  # per term, whole window
    nonfinite = torch.zeros(len(method.term_names), device=accelerator.device)
    tokens = torch.zeros((), device=accelerator.device)
    for j, batch in enumerate(batches):
        # accumulate(): gradients are all-reduced (DDP) or the DeepSpeed engine steps only on the window's
        # last micro-batch, and accelerate divides the loss by grad_accum (DeepSpeed's engine does).
        with accelerator.accumulate(model), accelerator.autocast():
            sums, metrics = method.loss_terms(model, batch)
            # x grad_accum undoes that division and x num_processes the ranks' gradient averaging: the
            # gradient is that of sum / global tokens of the whole window.
            scale = accelerator.num_processes * train.grad_accum
            loss = (run.term_weights * sums.float() / global_counts).sum() * scale
            accelerator.backward(loss)
        nonfinite += (~torch.isfinite(sums.detach().float())).float()
        window.add(sums, batch_counts[j], metrics)
        tokens += batch["attention_mask"].sum()
    max_norm = train.max_grad_norm if train.max_grad_norm else float("inf")
    # DeepSpeed clips inside its engine step (at the recipe's max_grad_norm) and this returns its norm.
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
    check_finite(accelerator.reduce(nonfinite, "sum"), grad_norm, step + 1, method.term_names, train)
    if grad_norm is not None:
        window.add_scalar("train/grad_norm", grad_norm)
    window.add_scalar("train/lr", run.scheduler.get_last_lr()[0])
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    window.steps += 1
    return tokens


def _train_record(
    run: _Run, window: MetricWindow, step: int, tokens: float, elapsed: float
) -> dict[str, float]:
    """The reduced train metrics of the window, with throughput."""
    record = with_derived(run.method, window.reduce(run.accelerator, "train"), "train")
    record["perf/tokens_per_s"] = tokens / max(elapsed, 1e-9)
    record["perf/step_s"] = elapsed / max(window.steps, 1)  # wall time per optimizer step
    record["train/epoch"] = step / run.schedule.steps_per_epoch
    return record


def _truncate_metrics(path: Path, step: int, accelerator: Accelerator, finished: bool) -> None:
    """Drop records logged after the resumed checkpoint, so metrics.jsonl reads as one uninterrupted run
    (`finished`: the checkpoint is the last step's, whose held-out evaluation runs again after it)."""

    def before(r: dict[str, Any]) -> bool:
        return r["step"] < step or (
            r["step"] == step and not (finished and any(k.startswith("eval/") for k in r))
        )

    if accelerator.is_main_process and path.is_file():
        kept = [r for r in read_metrics(path) if before(r)]
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
