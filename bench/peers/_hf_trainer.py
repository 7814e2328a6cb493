"""What the ModelOpt drivers (modelopt_eagle3.py, modelopt_dflash.py) share around the HF Trainer: the
collate function, a Trainer that keeps ModelOpt's training accuracy for the log, and a per-step timer.

Imported by those scripts as a sibling module (they run with the ModelOpt virtual environment's python, where
draftsmith is not installed)."""

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
