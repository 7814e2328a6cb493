"""Training metrics kept as tensors between log points, reduced across ranks only when logged.

Every step adds loss-term sums, token counts and metric sums (e.g. correct top-1 predictions) as tensors;
no `.item()` happens until `log.every` steps have passed, when one all-reduce per quantity turns them into
means over the logging window on all ranks. Rank 0 appends each record to `metrics.jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from draftsmith.runtime.display import fmt_value


def recorded(record: dict[str, float], keys: list[str]) -> list[float] | None:
    """The values of `keys` in a metrics record, or None when one is missing (a record without them)."""
    if any(key not in record for key in keys):
        return None
    return [record[key] for key in keys]


def start_to_end(key: str, end: dict[str, float], start: dict[str, float]) -> str:
    """A report cell: `end[key]` to 3 places, after `start[key]` and an arrow when it was measured before the
    first step (`0.021 -> 0.104`); "-" when `end` lacks it (no held-out evaluation ran: eval.every = 0)."""
    if key not in end:
        return "-"
    value = fmt_value(end[key])
    return f"{fmt_value(start[key])} -> {value}" if key in start else value


def chain_tau_estimate(accuracies: list[float]) -> float:
    """1 + sum over depths d of prod_{s<=d} acc_s: the tau a chain would reach if each depth were accepted
    independently with its teacher-forced accuracy (an ESTIMATE; the evaluator measures the real one)."""
    tau, prod = 1.0, 1.0
    for a in accuracies:
        prod *= a
        tau += prod
    return tau


class MetricWindow:
    """Running sums of per-term quantities `[K]` and scalars over a logging window."""

    def __init__(self, term_names: list[str], term_weights: torch.Tensor):
        self.term_names = term_names
        self.term_weights = term_weights
        self.reset()

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.metrics: dict[str, torch.Tensor] = {}
        self.scalars: dict[str, torch.Tensor] = {}
        self.steps = 0

    def add(self, sums: torch.Tensor, counts: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        sums, counts = sums.detach().float(), counts.detach().float()
        self.sums = sums if self.sums is None else self.sums + sums
        self.counts = counts if self.counts is None else self.counts + counts
        for k, v in metrics.items():
            v = v.detach().float()
            self.metrics[k] = v if k not in self.metrics else self.metrics[k] + v

    def add_scalar(self, name: str, value: torch.Tensor | float) -> None:
        value = torch.as_tensor(value, dtype=torch.float32).detach()
        self.scalars[name] = value if name not in self.scalars else self.scalars[name] + value

    def reduce(self, accelerator: Accelerator, prefix: str) -> dict[str, float]:
        """All-reduce the window and return `{prefix/loss, prefix/<term>/loss, prefix/<term>/<metric>}`.

        `prefix/loss` is the weighted sum of per-term means, i.e. the training objective over the window.
        Scalars are averaged over the window's steps. A collective call: every rank must enter it.
        """
        if self.sums is None or self.counts is None:
            return {}
        device = accelerator.device
        sums = accelerator.reduce(self.sums.to(device), "sum")
        counts = accelerator.reduce(self.counts.to(device), "sum")
        means = sums / counts.clamp(min=1)
        out: dict[str, float] = {f"{prefix}/loss": float((self.term_weights.to(device) * means).sum())}
        for i, name in enumerate(self.term_names):
            out[f"{prefix}/{name}/loss"] = float(means[i])
        for key, value in self.metrics.items():
            value = accelerator.reduce(value.to(device), "sum") / counts.clamp(min=1)
            for i, name in enumerate(self.term_names):
                out[f"{prefix}/{name}/{key}"] = float(value[i])
        for key, value in self.scalars.items():
            out[key] = float(accelerator.reduce(value.to(device), "mean")) / max(self.steps, 1)
        out[f"{prefix}/tokens"] = float(counts[0])
        return out


class MetricsLog:
    """Rank-0 `metrics.jsonl` writer plus accelerate trackers (wandb) when configured."""

    def __init__(self, accelerator: Accelerator, output_dir: Path):
        self.accelerator = accelerator
        self.path = output_dir / "metrics.jsonl"

    def write(self, step: int, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, **record}) + "\n")
        self.accelerator.log(record, step=step)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl` file. A partial last line (a run killed while appending it) is
    skipped; a damaged line anywhere else is an error naming the file and line."""
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as err:
            if number == len(lines):
                break  # the record being appended when the run died
            raise ValueError(
                f"{path}:{number} is not a JSON record ({err}); fix or delete that line"
            ) from None
    return records
