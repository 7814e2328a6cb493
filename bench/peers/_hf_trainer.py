"""What the ModelOpt drivers (modelopt_eagle3.py, modelopt_dflash.py) share around the HF Trainer: the
collate function, a Trainer that keeps ModelOpt's training accuracy for the log, a per-step timer, and the run
itself: train, export, and the timing summary both write to train_log.json.

Imported by those scripts as a sibling module (they run with the ModelOpt virtual environment's python, where
draftsmith is not installed)."""

import contextlib
import json
import os
import time

import torch
from transformers import Trainer, TrainerCallback


def collate(batch):
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


class AccuracyTrainer(Trainer):
    """Keeps the model output's `train_acc` (ModelOpt's per-step or per-slot top-1) of the last step."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        self._last_acc = outputs.train_acc
        return (outputs.loss, outputs) if return_outputs else outputs.loss


class StepLogger(TrainerCallback):
    """Wall seconds of every optimizer step and the trainer's logs, printed every `every` steps."""

    def __init__(self, trainer_ref, every, label="acc"):
        self.t0 = 0.0
        self.times = []
        self.records = []
        self.trainer_ref = trainer_ref
        self.every = every
        self.label = label

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        dt = time.perf_counter() - self.t0
        self.times.append(dt)
        acc = getattr(self.trainer_ref[0], "_last_acc", None)
        self.records.append({"step": state.global_step, "sec": dt, "train_acc": acc})
        if state.global_step % self.every == 0:
            print(f"step {state.global_step}: {dt:.3f}s  {self.label}={acc}", flush=True)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.records.append({"step": state.global_step, "log": logs})
            print(f"log step {state.global_step}: {logs}", flush=True)


def train_and_export(model, targs, ds, a, label):
    """Train `model` on `ds` with the HF Trainer (`targs`), export it with ModelOpt's exporter to `a.out`, and
    return the summary both drivers log: steps, total and per-step seconds, threads, sequence length and batch
    size (each driver adds its own settings, then `records`, the per-step log)."""
    ref: list = [None]  # the trainer, once built: the step logger reads its last accuracy
    logger = StepLogger(ref, a.log_every, label)
    trainer = AccuracyTrainer(
        model=model, args=targs, train_dataset=ds, data_collator=collate, callbacks=[logger]
    )
    ref[0] = trainer
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0

    model.eval()
    model.get_exporter().export(a.out)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(a.out, "_trainer"))  # empty with save_strategy=no
    times = logger.times
    steady = times[1:] if len(times) > 1 else times
    summary = {
        "steps": len(times),
        "total_train_s": total,
        "first_step_s": times[0] if times else None,
        "mean_step_s_excl_first": sum(steady) / max(1, len(steady)),
        "torch_threads": torch.get_num_threads(),
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
    }
    return summary, logger.records


def write_summary(out, summary):
    """train_log.json in `out`, and the summary without its per-step records on stdout."""
    with open(os.path.join(out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, default=str), flush=True)
