"""How a training run starts, before its first step: the run directory checked (the checkpoint to resume, the
disk space), the step schedule, optimizer and LR schedule built and the drafter prepared by accelerate, and a
resumed checkpoint's state loaded. loop.py runs the steps."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedType
from accelerate.logging import get_logger

from draftsmith.runtime.errors import UserError, require_space
from draftsmith.runtime.files import write_text

from .checkpointing import (
    all_ranks,
    checkpoint_format,
    estimate_checkpoint_bytes,
    read_trainer_state,
    resolve_resume,
    trainable_bytes,
)
from .data import sample_lengths
from .data_content import CONTENT_KEY, content_change
from .distributed import configure_deepspeed, shard_kind
from .method import TrainingMethod
from .metrics import read_metrics
from .sampler import StepSchedule
from .schedule import cosine_with_warmup, from_step
from .settings import LogConfig, TrainConfig
from .train_state import FORMAT as STATE_FORMAT
from .train_state import load_training_state

logger = get_logger(__name__)


@dataclass
class Run:
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
    trainable: int  # parameters the optimizer updates


def prepare_directory(
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


def build_run(
    method: TrainingMethod,
    accelerator: Accelerator,
    train: TrainConfig,
    log: LogConfig,
    config_yaml: str,
    output_dir: Path,
    train_dataset: Any,
    seed: int,
) -> Run:
    """The step schedule, the optimizer and LR schedule over the method's parameter groups, the model prepared
    by accelerate, and the trackers."""
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
    param_groups, optimizer, scheduler = _optimizer(method, train, total_steps)
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
    return Run(
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
        sum(p.numel() for g in param_groups for p in g["params"]),  # all the optimizer updates
    )


def _optimizer(
    method: TrainingMethod, train: TrainConfig, total_steps: int
) -> tuple[list[dict[str, Any]], torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the method's parameter groups (their trainable parameters) and its warm-up + cosine LR
    schedule; returns the groups too."""
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
    return param_groups, optimizer, scheduler


def check_same_data(resume_from: Path, content: dict[str, str] | None) -> None:
    """Refuse, in one line naming the file, to resume a checkpoint trained on data whose content has changed
    since (a data file edited in place): its steps would continue on other samples than the ones it counted.
    A checkpoint written before content was recorded, or a run whose content is unknown, is not compared."""
    if content is None:
        return
    change = content_change(read_trainer_state(resume_from).get(CONTENT_KEY), content, every_file=True)
    if change:
        raise UserError(
            f"cannot resume from {resume_from}: the data it was trained on has changed since: {change}; "
            "train on this data from the start with another output_dir, or restore the data to resume"
        )


def resume_run(run: Run, resume_from: Path, num_samples: int) -> int:
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
            accelerator.unwrap_model(run.model, keep_torch_compile=False),
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


def _truncate_metrics(path: Path, step: int, accelerator: Accelerator, finished: bool) -> None:
    """Drop records logged after the resumed checkpoint, so metrics.jsonl reads as one uninterrupted run
    (`finished`: the checkpoint is the last step's, whose held-out evaluation runs again after it)."""

    def before(r: dict[str, Any]) -> bool:
        return r["step"] < step or (
            r["step"] == step and not (finished and any(k.startswith("eval/") for k in r))
        )

    if accelerator.is_main_process and path.is_file():
        kept = [r for r in read_metrics(path) if before(r)]
        write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
