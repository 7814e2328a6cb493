"""The toy targets' presets: model shape and training schedule, one record per preset (toy/target.py trains
them; `draftsmith build-target --help` lists them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MAX_POSITIONS = 2048  # longer than any training block, so evaluation prompts + answers fit


@dataclass(frozen=True)
class ToyPreset:
    """Model shape and training schedule of one toy target.

    Attributes:
        vocab_size: BPE vocabulary size, special tokens and the 256 byte symbols included.
        hidden_size: model width.
        num_layers: decoder layers; >= 8 for targets, so EAGLE-3's default taps (2, L//2, L-3) are distinct.
        num_heads: attention heads (no grouped-query attention: the toy is small anyway).
        intermediate_size: SwiGLU MLP width.
        seq_len: tokens per packed training block.
        batch_size: blocks per optimizer step.
        max_steps: optimizer steps.
        lr: peak AdamW learning rate.
        warmup_steps: linear warm-up steps before the cosine decay.
        min_lr_ratio: the cosine decays to lr * min_lr_ratio, not to 0, so the last steps still learn.
        weight_decay: AdamW weight decay (matrices only; norms and embeddings are not decayed).
        heldout_blocks: at most this many held-out blocks are scored, bounding evaluation time.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    seq_len: int
    batch_size: int
    max_steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    heldout_blocks: int = 256

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"hidden_size={self.hidden_size} must split into num_heads={self.num_heads} heads of even "
                "size (rotary embeddings rotate pairs of dimensions)"
            )
        if self.seq_len > MAX_POSITIONS or min(self.max_steps, self.batch_size, self.seq_len) < 1:
            raise ValueError(f"need 1 <= seq_len <= {MAX_POSITIONS}, max_steps >= 1, batch_size >= 1: {self}")


# Timings measured on 2 CPU cores (see docs/BENCHMARKS.md for the build table). A few minutes of CPU is a
# step-limited budget: at equal tokens, batches of 4 x 256 reached a clearly lower loss than 8-16 x 256-512
# (and 256-token blocks run ~1.4x faster per token than 512 on CPU), so both presets take many small steps.
_SMALL = ToyPreset(
    vocab_size=2048,
    hidden_size=96,
    num_layers=8,
    num_heads=4,
    intermediate_size=288,
    seq_len=256,
    batch_size=4,
    max_steps=2800,
    lr=4e-3,
    warmup_steps=150,
)

PRESETS: dict[str, ToyPreset] = {
    # ~0.5M parameters, about a minute: end-to-end tests. Two heads of 32: vLLM's CPU attention serves head
    # sizes from 32 up (the closed-loop test serves this target in vLLM).
    "tiny": ToyPreset(
        vocab_size=1024,
        hidden_size=64,
        num_layers=8,
        num_heads=2,
        intermediate_size=192,
        seq_len=256,
        batch_size=4,
        max_steps=700,
        lr=5e-3,
        warmup_steps=50,
    ),
    # ~1.2M parameters, about five minutes: quickstart and benchmarks. Compute-bound at ~3e13 FLOP, a
    # narrower model that sees ~2.9M tokens (about 3 epochs) beat a 3.2M-parameter one that saw 1.6M:
    # 1.53 vs 1.64 held-out bits per character, in 272 s vs 307 s (docs/BENCHMARKS.md).
    "small": _SMALL,
    # A draft, not a target (see DRAFT_PRESETS): a 1-layer LM trained like `small` on the same corpus,
    # hence with the same tokenizer (BPE training depends only on the corpus and vocab_size), so it can
    # draft for `small` (draft_lm).
    "small-draft1": dataclasses.replace(_SMALL, num_layers=1),
}
DRAFT_PRESETS = frozenset({"small-draft1"})  # presets that train draft LMs for another preset, not targets
