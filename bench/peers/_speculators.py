"""What the speculators drivers (speculators_eagle3.py, speculators_dflash.py) share: the in-process HF target
that serves hidden states, speculators' data preparation and packed loader, its Trainer on the CPU, and the
training log. speculators_eagle3.py's docstring explains each piece and every deviation from speculators'
defaults.

Imported by those scripts as a sibling module (they run with the speculators virtual environment's python,
where draftsmith is not installed)."""

import argparse
import logging
import math
import shutil
import sys
import time
from importlib.metadata import version as pkg_version
from pathlib import Path

import torch


class MetricCapture(logging.Handler):
    """Collects speculators' per-step metric dicts (logger `speculators.metrics`) with wall-clock stamps."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records: list[dict] = []
        self.stamps: list[float] = []

    def emit(self, record):
        msg = record.msg
        if isinstance(msg, dict) and "train" in msg:
            self.stamps.append(time.perf_counter())
            self.records.append(msg)


def make_hf_online_transfer(model_dir: str, data_dir: str, layer_ids: list[int]):
    """A `HiddenStatesTransfer` that runs the HF target in process (see the module docstring)."""
    from datasets import load_from_disk
    from hs_connectors import HiddenStatesTransfer
    from transformers import AutoModelForCausalLM

    class HFOnlineTransfer(HiddenStatesTransfer):
        def __init__(self):
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
            self.data = load_from_disk(data_dir)  # the full prepared dataset; file_idx indexes it
            base = self.model.model
            L = len(base.layers)
            self.ids = list(layer_ids) + [L]
            self._cap: dict[int, torch.Tensor] = {}

            def grab(k):
                def hook(_mod, args, kwargs):
                    self._cap[k] = (args[0] if args else kwargs["hidden_states"]).detach()

                return hook

            for k in layer_ids:
                base.layers[k].register_forward_pre_hook(grab(k), with_kwargs=True)
            base.norm.register_forward_pre_hook(grab(L), with_kwargs=True)  # pre-norm output of layer L-1
            self.calls = 0
            self.seconds = 0.0

        @torch.no_grad()
        def run(self, input_ids: torch.Tensor) -> torch.Tensor:
            self._cap.clear()
            self.model.model(input_ids=input_ids[None].long(), use_cache=False)
            return torch.stack([self._cap[k][0] for k in self.ids], dim=1)  # [T, n_ids+1, H]

        def get_cached(self, file_idx: int):
            t0 = time.perf_counter()
            ids = self.data[file_idx]["input_ids"]
            hs = self.run(ids)
            self.calls += 1
            self.seconds += time.perf_counter() - t0
            return {"hidden_states": hs, "token_ids": ids}

        def get_generated(self, hs_transfer_params):
            raise RuntimeError("HFOnlineTransfer serves every sample from get_cached; nothing is generated")

        @torch.no_grad()
        def self_check(self) -> float:
            """The hooks give HF's hidden_states[k] (k < L) and the pre-norm state whose norm is the output."""
            ids = self.data[0]["input_ids"]
            hs = self.run(ids)
            out = self.model.model(input_ids=ids[None].long(), output_hidden_states=True, use_cache=False)
            err = 0.0
            for j, k in enumerate(self.ids[:-1]):
                err = max(err, (hs[:, j] - out.hidden_states[k][0]).abs().max().item())
            normed = self.model.model.norm(hs[:, -1][None])[0]
            err = max(err, (normed - out.last_hidden_state[0]).abs().max().item())
            return err

    return HFOnlineTransfer()


def pick_token_budget(lengths, n_batches: int, seq_len: int, seed: int) -> tuple[int, int]:
    """Largest packing budget for which speculators' multipack sampler yields >= n_batches batches (epoch 0)."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    def count(budget):
        s = MultipackDistributedBatchSamplerV2(
            batch_max_length=budget, lengths=lengths, num_replicas=1, rank=0, seed=seed
        )
        return len(s)

    lo, hi = seq_len, max(seq_len, sum(lengths))  # count(lo) >= n_batches is required
    if count(lo) < n_batches:
        return lo, count(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) >= n_batches:
            lo = mid
        else:
            hi = mid
    return lo, count(lo)


def common_args(description: str, optimizer: str) -> argparse.ArgumentParser:
    """The flags every speculators driver takes (bench_peers passes them alike); `optimizer` is the default."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="local HF dir of the target")
    p.add_argument("--data", required=True, help='JSONL of {"input_ids": [...], "loss_mask": [...]} rows')
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="sets the packing token budget: the sampler yields >= N // batch-size batches per epoch",
    )
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-scheduler", default="linear", choices=["linear", "cosine", "none"])
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument(
        "--optimizer", default=optimizer, choices=["muon", "adamw"], help="speculators default: muon"
    )
    p.add_argument("--total-seq-len", type=int, default=None, help="packing budget (default: searched)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p


def start_run(a: argparse.Namespace) -> tuple[Path, Path, Path]:
    """Threads, the output directory, the CPU patches and speculators' logging: `(out, prepared data dir,
    trainer checkpoint dir)`.
    The last two are emptied: a run never resumes from, or reuses the token counts of, an earlier one."""
    from speculators.train.logger import setup_root_logger

    torch.set_num_threads(a.threads)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir, ckpt_dir = out / "prepared_data", out / "trainer_checkpoints"
    for d in (data_dir, ckpt_dir):
        if d.exists():
            shutil.rmtree(d)
    patch_for_cpu()
    setup_root_logger()
    return out, data_dir, ckpt_dir


def speculators_argv(
    a: argparse.Namespace,
    kind: str,
    out: Path,
    data_dir: Path,
    ckpt_dir: Path,
    budget: int,
    layer_ids: list[int],
    epochs: int,
) -> list[str]:
    """The `speculators train` flags both drivers set alike (their docstrings explain each); each adds its own."""
    return [
        "--verifier-name-or-path",
        a.model,
        "--speculator-type",
        kind,
        "--data-path",
        str(data_dir),
        "--save-path",
        str(ckpt_dir),
        "--target-layer-ids",
        *[str(k) for k in layer_ids],
        "--draft-attn-impl",
        "sdpa",
        "--loss-implementation",
        "eager",
        "--optimizer",
        a.optimizer,
        "--lr",
        str(a.lr),
        "--scheduler-type",
        a.lr_scheduler,
        "--scheduler-warmup-steps",
        str(a.warmup_steps),
        "--max-steps",
        str(a.steps),
        "--epochs",
        str(epochs),
        "--total-seq-len",
        str(budget),
        "--hidden-states-dtype",
        "float32",
        "--num-workers",
        "0",
        "--seed",
        str(a.seed),
        "--log-dir",
        str(out / "logs"),
        "--no-resume-from-checkpoint",
    ]


def resolve(argv: list[str], out: Path) -> tuple[argparse.Namespace, MetricCapture]:
    """speculators' own TrainConfig from `argv` (saved as OUT/run.yaml + train_command.txt), its seed and
    loggers set, and a capture of its per-step metrics."""
    from speculators.train.cli import set_seed
    from speculators.train.config import TrainConfig
    from speculators.train.logger import setup_metric_logger

    cfg = TrainConfig.resolve(argv)
    args = argparse.Namespace(**cfg.flatten())
    print("equivalent: speculators train " + " ".join(argv), flush=True)
    cfg.save(str(out))
    set_seed(args.seed, args.deterministic_cuda)
    setup_metric_logger(loggers=args.logger, run_name=args.run_name, output_dir=args.log_dir)
    capture = MetricCapture()
    logging.getLogger("speculators.metrics").addHandler(capture)
    return args, capture


def patch_for_cpu() -> None:
    """speculators 0.9 assumes an accelerator: its Trainer moves to `get_local_rank()` (CUDA device 0) and its
    step timer calls `torch.accelerator.synchronize`, which raises on a CPU-only build."""
    import speculators.train.trainer as spec_trainer

    cpu = torch.device("cpu")
    spec_trainer.get_local_rank = lambda: cpu
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None


def prepare_data(a: argparse.Namespace, data_dir: Path, token_freq: bool) -> tuple[int, list[int]]:
    """`speculators prepare-data` on --data, saved under `data_dir`: `(samples, their lengths)`; `token_freq`
    also counts the answer tokens (the draft vocabulary's source)."""
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    dataset, _ = load_and_preprocess_dataset(
        target_model_path=a.model,
        train_data_paths=[a.data],
        seq_length=a.seq_len,
        build_dataset_num_proc=1,
        seed=a.seed,
        max_samples=a.max_samples,
        token_freq_path=data_dir / "token_freq.pt",
        skip_token_freq=not token_freq,
    )
    dataset.save_to_disk(str(data_dir))
    n_samples = len(dataset)
    lengths = list(dataset.with_format(None)["seq_len"])
    return n_samples, lengths


def token_budget(a: argparse.Namespace, n_samples: int, lengths: list[int]) -> tuple[int, int]:
    """`(budget, epochs)`: --total-seq-len, or the largest packing budget giving at least N // --batch-size
    batches an epoch (so a step packs about --batch-size samples, as the other trainers' steps hold), and the
    epochs that make at least --steps steps (--max-steps stops there: 120 steps over 337 samples of batch 8 are
    2.84 epochs, as for draftsmith and ModelOpt, not one epoch of 2.8-sample steps)."""
    per_epoch = max(1, n_samples // a.batch_size)
    if a.total_seq_len:
        budget = a.total_seq_len
    else:
        budget, per_epoch = pick_token_budget(lengths, per_epoch, a.seq_len, a.seed)
    return budget, max(1, math.ceil(a.steps / max(1, per_epoch)))


def build_loader(
    a,
    data_dir: Path,
    budget: int,
    hidden_size: int,
    layer_ids: list[int],
    preprocess,
    seed: int,
    lengths: list[int],
):
    """speculators' ArrowDataset (every sample trains) + `_setup_dataloader`, fed by the in-process target.

    Returns `(loader, transfer, hook_err, samples per trained batch, tokens per trained batch)`."""
    from speculators.train.data import ArrowDataset
    from speculators.train.dataloader import _setup_dataloader

    transfer = make_hf_online_transfer(a.model, str(data_dir), list(layer_ids))
    hook_err = transfer.self_check()
    print(f"hidden-state hooks vs HF hidden_states / final norm: max abs diff {hook_err:.3g}", flush=True)
    assert hook_err < 1e-5, "hidden-state hooks do not reproduce HF's hidden states"
    train_ds = ArrowDataset(
        max_len=budget,
        datapath=str(data_dir),
        transfer=transfer,
        on_missing="raise",
        train_ratio=1.0,
        split="train",
        hidden_states_dtype=torch.float32,
        model=a.model,
    )
    loader = _setup_dataloader(
        train_ds,
        budget,
        hidden_size,
        num_workers=0,
        num_target_layers=len(layer_ids),
        prefetch_factor=None,
        preprocess=preprocess,
        seed=seed,
    )
    batches = loader.batch_sampler._generate_batches(0)[: a.steps]
    per_batch = [len(b) for b in batches]
    tok_batch = [int(sum(lengths[i] for i in b)) for b in batches]
    print(
        f"sampler: {len(loader)} batches/epoch, training {len(batches)}: samples/step mean "
        f"{sum(per_batch) / len(per_batch):.2f} (min {min(per_batch)}, max {max(per_batch)}), tokens/step mean "
        f"{sum(tok_batch) / len(tok_batch):.0f}",
        flush=True,
    )
    return loader, transfer, hook_err, per_batch, tok_batch


def train(model, model_class, args: argparse.Namespace, loader):
    """speculators' Trainer over `loader` with the resolved flags `args`: `(trained model, start, wall seconds)`."""
    from speculators.train.trainer import Trainer, TrainerConfig

    train_kw, val_kw = model_class.get_trainer_kwargs(**vars(args))
    tconf = TrainerConfig(
        num_epochs=args.epochs,
        save_path=args.save_path,
        lr=args.lr,
        resume_from_checkpoint=not args.no_resume_from_checkpoint,
        train_call_kwargs=train_kw,
        val_call_kwargs=val_kw,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        muon_lr=args.muon_lr,
        muon_momentum=args.muon_momentum,
        muon_weight_decay=args.muon_weight_decay,
        muon_ns_steps=args.muon_ns_steps,
        muon_adjust_lr_fn=args.muon_adjust_lr_fn,
        scheduler_type=args.scheduler_type,
        scheduler_warmup_steps=args.scheduler_warmup_steps,
        scheduler_warmup_ratio=args.scheduler_warmup_ratio,
        scheduler_total_steps=args.scheduler_total_steps,
        scheduler_num_cosine_cycles=args.scheduler_num_cosine_cycles,
        checkpoint_freq=args.checkpoint_freq,
        save_best=args.save_best,
        hidden_states_dtype=getattr(torch, args.hidden_states_dtype),
        log_freq=args.log_freq,
        fsdp_shard=args.fsdp_shard,
        gradient_checkpointing=args.gradient_checkpointing,
        max_steps=args.max_steps,
    )
    trainer = Trainer(model, tconf, loader, None)
    t0 = time.perf_counter()
    trainer.run_training()
    return trainer.model, t0, time.perf_counter() - t0


def training_log(capture: MetricCapture, t0: float, total: float, transfer, per_batch, tok_batch) -> dict:
    """The common part of train_log.json: step times, speculators' metrics and profile, versions, packing."""
    stamps = [t0, *capture.stamps]
    times = [b - a_ for a_, b in zip(stamps[:-1], stamps[1:], strict=True)]
    steady = times[1:] if len(times) > 1 else times
    recs = [
        {"step": r["global_step"], "sec": dt, "lr": r["lr"], "train": r["train"], "profile": r["profile"]}
        for r, dt in zip(capture.records, times, strict=True)
    ]
    keys = sorted(capture.records[-1]["train"]) if capture.records else []
    tail = capture.records[-20:]
    prof_keys = ("fetch_ms", "fwd_ms", "bwd_ms", "opt_ms", "step_ms")
    profs = [r["profile"] for r in capture.records[1:] if r.get("profile")]
    return {
        "steps": len(times),
        "total_train_s": total,
        "first_step_s": times[0] if times else None,
        "mean_step_s_excl_first": sum(steady) / max(1, len(steady)),
        "speculators_profile_mean_excl_first": (
            {k: sum(p_[k] for p_ in profs) / len(profs) for k in prof_keys} if profs else None
        ),
        "target_forward_s_total": transfer.seconds,
        "target_forward_calls": transfer.calls,
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "speculators": pkg_version("speculators"),
            "torch": torch.__version__,
            "transformers": pkg_version("transformers"),
            "python": sys.version.split()[0],
        },
        "samples_per_step_mean": sum(per_batch) / len(per_batch),
        "tokens_per_step_mean": sum(tok_batch) / len(tok_batch),
        "samples_seen": sum(per_batch),
        "final_train_metrics": capture.records[-1]["train"] if capture.records else None,
        "last20_mean_train_metrics": {k: sum(r["train"][k] for r in tail) / len(tail) for k in keys},
        "records": recs,
    }
