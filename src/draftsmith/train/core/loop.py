"""The one training loop, on `accelerate.Accelerator`, shared by every drafter recipe.

A recipe supplies a `TrainingMethod` (method.py): the trainable module, how many loss tokens each loss term
has in a batch (known before the forward pass), and a forward that returns per-term loss sums. The loop normalises each
term by its token count over the whole accumulation window on all ranks, so an optimizer step computes the
same update for any split into ranks x micro-batches x accumulation (DESIGN.md section 3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from draftsmith.runtime.errors import Interrupted
from draftsmith.runtime.files import write_text

from .checkpointing import save_checkpoint
from .data import collate
from .data_content import CONTENT_KEY
from .distributed import shard_kind
from .finite import check_finite
from .method import LoopResult, TrainingMethod
from .metrics import MetricsLog, MetricWindow
from .selection import Selection
from .settings import CheckpointConfig, EvalConfig, LogConfig, TrainConfig
from .startup import Run, build_run, check_same_data, prepare_directory, resume_run
from .stop import StopRequest, stopped_message


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
    prog: str,
    resume: str | None = None,
    trust_pickle: bool = False,
    data_sha256: dict[str, str] | None = None,
) -> LoopResult:
    """Train `method.model` and return the final step, last logged train metrics and held-out metrics.

    `config_yaml` (the resolved recipe config) is saved in the run directory and every checkpoint.
    `prog`: the recipe's command, which the message of a run stopped by Ctrl-C / SIGTERM names (stop.py).
    `trust_pickle`: resume from a checkpoint holding pickle files (see checkpointing.resolve_resume).
    `data_sha256`: the sha256 of each local data file the samples come from (data_content.py), recorded in
    every checkpoint's trainer_state.json; resuming a checkpoint whose data changed since is refused.
    """
    resume_from = prepare_directory(accelerator, method, output_dir, resume, trust_pickle)
    if resume_from is not None:
        check_same_data(resume_from, data_sha256)
    run = build_run(method, accelerator, train, log, config_yaml, output_dir, train_dataset, seed)
    step = resume_run(run, resume_from, len(train_dataset)) if resume_from is not None else 0
    if accelerator.is_main_process:
        write_text(output_dir / "config.yaml", config_yaml)
    loop = _Loop(
        run=run,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        pad_id=pad_id,
        seed=seed,
        config_yaml=config_yaml,
        log=log,
        checkpoint=checkpoint,
        eval_cfg=eval_cfg,
        metrics_log=MetricsLog(accelerator, output_dir),
        data_sha256=data_sha256,
        selection=Selection(eval_cfg.select, eval_cfg.patience, shard_kind(accelerator) is not None),
        prog=prog,
    )
    # The starting point, so every run shows how far training moved the held-out metrics.
    initial_eval = loop.evaluate_and_log(step) if step == 0 else {}
    step, last_train = _train_steps(loop, step)
    eval_metrics = loop.evaluate_and_log(step)
    loop.selection.offer(step, eval_metrics, run.model, accelerator)
    # The caller ends the run (`accelerator.end_training()`) after saving: ending it here would tear down
    # the process group, after which every rank believes it is the main process.
    # FSDP / ZeRO-3 leave each rank a shard of the drafter: gather it (a collective: every rank calls it).
    state_dict = accelerator.get_state_dict(run.model) if shard_kind(accelerator) is not None else None
    method.model = accelerator.unwrap_model(run.model, keep_torch_compile=False)
    chosen = loop.selection
    if chosen.select == "best":  # final/ holds the best held-out evaluation's weights, not the last step's
        state_dict, eval_metrics = chosen.restore(method.model), chosen.metrics
    return LoopResult(
        step=step,
        last_train=last_train,
        eval=eval_metrics,
        initial_eval=initial_eval,
        state_dict=state_dict,
        selection=chosen.summary() if chosen.select == "best" else None,
    )


@dataclass
class _Loop:
    """One run's loop: the run as built, its data and the schedules of logging, evaluation and checkpoints."""

    run: Run
    train_dataset: Any
    eval_dataset: Any
    pad_id: int
    seed: int
    config_yaml: str
    log: LogConfig
    checkpoint: CheckpointConfig
    eval_cfg: EvalConfig
    metrics_log: MetricsLog
    data_sha256: dict[str, str] | None = None  # the data's content, which resuming must match
    selection: Selection = field(default_factory=lambda: Selection("last", 0, False))
    prog: str = "draftsmith train"  # the recipe's command, for the message of a stopped run

    def held_out(self) -> dict[str, float]:
        """The held-out metrics now (empty without held-out data)."""
        run = self.run
        return evaluate(
            run.method,
            run.model,
            self.eval_dataset,
            self.pad_id,
            run.accelerator,
            self.eval_cfg.micro_batch_size,
        )

    def evaluate_and_log(self, step: int) -> dict[str, float]:
        """The held-out metrics at `step`, logged when there are any."""
        metrics = self.held_out()
        if metrics:
            self.metrics_log.write(step, metrics)
        return metrics

    def save(self, step: int) -> None:
        """Write checkpoint-<step> (every rank)."""
        run = self.run
        save_checkpoint(
            run.accelerator,
            run.output_dir,
            step,
            self.trainer_state(step),
            self.config_yaml,
            self.checkpoint.keep_last,
            run.model,
            run.optimizer,
            run.scheduler,
            run.sharded,
        )

    def trainer_state(self, step: int) -> dict[str, Any]:
        """A checkpoint's trainer_state.json: where the run is and what resuming it must match."""
        run = self.run
        return {
            "step": step,
            "epoch": run.schedule.epoch_of(step),
            "total_steps": run.total_steps,
            "samples_per_step": run.schedule.samples_per_step,
            "num_train_samples": len(self.train_dataset),
            "seed": self.seed,
            "num_processes": run.accelerator.num_processes,
            "trainable_parameters": run.trainable,
            CONTENT_KEY: self.data_sha256,
        }


def _train_steps(loop: _Loop, step: int) -> tuple[int, dict[str, float]]:
    """The optimizer steps from `step` to the last, with logging, held-out evaluation and checkpoints on their
    schedules and a checkpoint of the last step; returns the last step and the last logged train metrics.

    Raises:
        Interrupted: Ctrl-C or SIGTERM (stop.py): after the step under way and a checkpoint of it.
    """
    with StopRequest() as stop:
        return _steps_until_done_or_stopped(loop, step, stop)


def _steps_until_done_or_stopped(loop: _Loop, step: int, stop: StopRequest) -> tuple[int, dict[str, float]]:
    run, accelerator = loop.run, loop.run.accelerator
    window = MetricWindow(run.method.term_names, run.method.term_weights)
    last_train: dict[str, float] = {}
    last_saved = step
    run.model.train()
    bar = tqdm(
        total=run.total_steps, initial=step, desc="train", disable=not accelerator.is_local_main_process
    )
    t_window, tokens_window = time.perf_counter(), torch.zeros((), device=accelerator.device)
    while step < run.total_steps:
        micro_batches = run.schedule.micro_batches(step, accelerator.process_index)
        batches = list(_batches(loop.train_dataset, micro_batches, loop.pad_id, accelerator.device))
        tokens_window += _optimizer_step(run, step, batches, window)
        step += 1
        bar.update(1)
        if step % loop.log.every == 0 or step == run.total_steps:
            elapsed = time.perf_counter() - t_window
            last_train = _train_record(
                run, window, step, float(accelerator.reduce(tokens_window, "sum")), elapsed
            )
            loop.metrics_log.write(step, last_train)
            bar.set_postfix(loss=f"{last_train['train/loss']:.4f}")
            window.reset()
            t_window, tokens_window = time.perf_counter(), torch.zeros((), device=accelerator.device)
        evaluated = loop.eval_cfg.every and step % loop.eval_cfg.every == 0 and step < run.total_steps
        if evaluated:
            metrics = loop.held_out()
            loop.metrics_log.write(step, metrics)
            loop.selection.offer(step, metrics, run.model, accelerator)
        if loop.checkpoint.every and step % loop.checkpoint.every == 0:
            loop.save(step)
            last_saved = step
        if evaluated and loop.selection.stop:  # eval.patience: no better evaluation for that many in a row
            break
        if stop.agreed(accelerator):
            bar.close()
            if last_saved != step:
                loop.save(step)
            message = stopped_message(loop.prog, run.output_dir, step, run.total_steps)
            raise Interrupted(message if accelerator.is_main_process else "")
    bar.close()
    if last_saved != step:
        loop.save(step)
    return step, last_train


def _optimizer_step(run: Run, step: int, batches: list[dict[str, torch.Tensor]], window: MetricWindow) -> Any:
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
    run: Run, window: MetricWindow, step: int, tokens: float, elapsed: float
) -> dict[str, float]:
    """The reduced train metrics of the window, with throughput."""
    record = with_derived(run.method, window.reduce(run.accelerator, "train"), "train")
    record["perf/tokens"] = tokens  # read in the window: summed over records, the tokens a run trained on
    record["perf/tokens_per_s"] = tokens / max(elapsed, 1e-9)
    record["perf/step_s"] = elapsed / max(window.steps, 1)  # wall time per optimizer step
    if torch.cuda.is_available():  # the most GPU memory this process has held so far
        record["perf/peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    record["train/epoch"] = step / run.schedule.steps_per_epoch
    return record
