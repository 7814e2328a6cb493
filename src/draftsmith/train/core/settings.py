"""The loop's settings: the `train`, `log`, `checkpoint` and `eval` sections every recipe shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class TrainConfig:
    """Optimisation settings."""

    micro_batch_size: int = field(default=4, metadata={"help": "Samples per forward pass on one process."})
    grad_accum: int = field(default=1, metadata={"help": "Micro-batches per optimizer step on one process."})
    max_steps: int | None = field(default=None, metadata={"help": "Optimizer steps; None: from `epochs`."})
    epochs: float = field(
        default=1.0, metadata={"help": "Passes over the training set when max_steps is None."}
    )
    lr: float = field(default=1e-3, metadata={"help": "Peak learning rate (AdamW)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata={"help": "AdamW betas."})
    warmup_ratio: float = field(default=0.1, metadata={"help": "Linear warmup as a fraction of the steps."})
    min_lr_ratio: float = field(default=0.0, metadata={"help": "Cosine decay floor as a fraction of lr."})
    max_grad_norm: float | None = field(
        default=1.0, metadata={"help": "Clip the global grad norm; null: off."}
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = field(
        default="no", metadata={"help": "Autocast precision for forward passes; 'no' = float32."}
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the drafter's forward (accelerate's dynamo backend, inductor); on a CPU it "
            'was no faster (docs/BENCHMARKS.md, "Compiled or not, stage by stage").'
        },
    )
    shuffle: bool = field(default=True, metadata={"help": "Reshuffle the training set every epoch."})
    group_by_length: bool = field(
        default=False,
        metadata={
            "help": "Batch samples of similar length together (less padding; steps still in random order): "
            "each epoch's shuffled samples are sorted by length in windows of 32 steps."
        },
    )
    loss_chunk_tokens: int = field(
        default=256,
        metadata={
            "help": "Tokens (rows x positions) whose vocabulary-sized logits exist at once in a chunked loss: "
            "memory against speed, the loss is the same for any value (256: 128 MiB of float32 logits at a "
            "128k vocabulary; EAGLE-3 gives each TTT step 1/S of them)."
        },
    )
    allow_unserved: bool = field(
        default=False,
        metadata={
            "help": "Train a drafter that no serving engine loads for this target (e.g. MTP modules for a "
            "Llama target), for draftsmith's own evaluator; refused before the first step otherwise."
        },
    )

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.grad_accum < 1:
            raise ValueError("micro_batch_size and grad_accum must be >= 1")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(
                f"train.max_steps must be >= 1 (or null: as many steps as train.epochs take), got {self.max_steps}"
            )
        if self.loss_chunk_tokens < 1:
            raise ValueError(f"train.loss_chunk_tokens must be >= 1 (e.g. 256), got {self.loss_chunk_tokens}")
        if not self.epochs > 0:
            raise ValueError(f"train.epochs must be > 0, got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"train.max_grad_norm must be > 0 (or null: no clipping), got {self.max_grad_norm}"
            )


@dataclass
class LogConfig:
    """Where metrics go."""

    every: int = field(default=10, metadata={"help": "Reduce and log metrics every N optimizer steps."})
    wandb: bool = field(default=False, metadata={"help": "Also log to Weights & Biases."})
    wandb_project: str = field(default="draftsmith", metadata={"help": "wandb project name."})
    wandb_mode: Literal["offline", "online"] = field(
        default="offline", metadata={"help": "offline needs no account; sync later with `wandb sync`."}
    )
    run_name: str | None = field(default=None, metadata={"help": "Run name for trackers."})


@dataclass
class CheckpointConfig:
    """Resumable checkpoints."""

    every: int = field(
        default=500, metadata={"help": "Save checkpoint-<step>/ every N steps (0: at the end)."}
    )
    keep_last: int = field(default=2, metadata={"help": "Keep only the newest N checkpoints (0: keep all)."})


@dataclass
class EvalConfig:
    """Held-out evaluation during training."""

    every: int = field(default=0, metadata={"help": "Evaluate every N steps (0: only at the end)."})
    micro_batch_size: int = field(default=8, metadata={"help": "Samples per evaluation forward pass."})
    select: str = field(
        default="last",
        metadata={
            "help": "Which drafter final/ holds: last (the last step's) or best (the held-out evaluation with the "
            "highest teacher-forced tau estimate; needs eval.every > 0). train/core/selection.py."
        },
    )
    patience: int = field(
        default=0,
        metadata={
            "help": "With select=best: stop after N evaluations without a better one (0: never early)."
        },
    )

    def __post_init__(self) -> None:
        if self.select not in ("last", "best"):
            raise ValueError(f"eval.select must be 'last' or 'best', got {self.select!r}")
        if self.select == "best" and self.every <= 0:
            raise ValueError(
                "eval.select=best ranks the held-out evaluations every eval.every steps: set eval.every > 0"
            )
        if self.patience < 0 or (self.patience and self.select != "best"):
            raise ValueError(
                f"eval.patience is a count of evaluations (>= 0) with eval.select=best, got {self.patience}"
            )


@dataclass
class LoopSections:
    """The sections the training loop reads, which close every recipe: `train`, `log`, `checkpoint`, `eval`."""

    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
