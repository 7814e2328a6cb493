"""bench/peers/_hf_trainer.py: the run both ModelOpt drivers share (train with the HF Trainer, export, summarise),
on a linear model that plays ModelOpt's part (its outputs carry `loss` and `train_acc`, its exporter writes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformers import TrainingArguments

sys.path.insert(
    0, str(Path(__file__).resolve().parents[3] / "bench" / "peers")
)  # the drivers' sibling import
from _hf_trainer import train_and_export, write_summary  # noqa: E402


class Regression(nn.Module):
    def __init__(self, out: Path):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.out = out

    def forward(self, x, y):
        loss = ((self.linear(x).squeeze(-1) - y) ** 2).mean()
        return SimpleNamespace(loss=loss, train_acc=[float(loss.detach())])

    def get_exporter(self):
        return SimpleNamespace(export=lambda path: (Path(path) / "model.pt").write_bytes(b"exported"))


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


def test_a_run_trains_every_step_exports_and_logs_its_times(tmp_path):
    a = SimpleNamespace(out=str(tmp_path), log_every=2, seq_len=1, batch_size=4)
    targs = TrainingArguments(
        output_dir=str(tmp_path / "_trainer"),
        use_cpu=True,
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        save_strategy="no",
        report_to=[],
        logging_steps=2,
        disable_tqdm=True,
    )
    model = Regression(tmp_path)
    before = float(model(**Rows(32)[:32]).loss.detach())
    summary, records = train_and_export(model, targs, Rows(32), a, "acc")
    assert summary["steps"] == 6 and summary["batch_size"] == 4 and summary["seq_len"] == 1
    assert summary["total_train_s"] >= summary["mean_step_s_excl_first"] * 5
    assert [r["step"] for r in records if "sec" in r] == [1, 2, 3, 4, 5, 6]
    assert float(model(**Rows(32)[:32]).loss.detach()) < before  # the Trainer stepped the optimizer
    assert (tmp_path / "model.pt").read_bytes() == b"exported"
    assert not (tmp_path / "_trainer").exists()  # the empty trainer folder is removed
    write_summary(a.out, {**summary, "records": records})
    logged = json.loads((tmp_path / "train_log.json").read_text())
    assert logged["steps"] == 6 and len(logged["records"]) >= 6
