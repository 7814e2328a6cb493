"""Vocabulary-chunked losses: a loss over V-sized logits computed a chunk of positions at a time, each chunk
recomputed in the backward pass, so a 128k-262k vocabulary never holds [tokens, V] logits at once; only the
positions that train reach the head (`keep`), and the per-token cross-entropy runs over flattened rows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

# Tokens (micro-batch rows x positions) whose vocabulary-sized logits exist at once in a chunked loss, the
# default of `train.loss_chunk_tokens`: one float32 chunk of V = 128k logits is 128 MiB. A recipe with a small
# vocabulary can afford more, and a CPU runs larger products faster: SmolLM2's EAGLE-3 recipe takes 2,048
# (docs/BENCHMARKS.md, "The quickstart on SmolLM2-135M-Instruct").
LOSS_CHUNK_TOKENS = 256

ChunkResult = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]

_RECOMPUTING: ContextVar[bool] = ContextVar("draftsmith_loss_recomputing", default=False)


def recomputing() -> bool:
    """True while `chunked_loss` recomputes a chunk for the backward pass. Its outputs are discarded then, so
    metrics (argmax, top-k over the vocabulary), which no gradient needs, are skipped."""
    return _RECOMPUTING.get()


@contextlib.contextmanager
def _recomputation() -> Iterator[None]:
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)


def _checkpoint_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    return contextlib.nullcontext(), _recomputation()


def chunk_positions(batch_size: int, tokens: int = LOSS_CHUNK_TOKENS) -> int:
    """Sequence positions per chunk so that a chunk holds about `tokens` tokens of a `batch_size`-row batch."""
    if tokens < 1:
        raise ValueError(f"a loss chunk must hold at least one token, got {tokens}")
    return max(1, tokens // max(1, batch_size))


def chunked_loss(
    fn: Callable[..., ChunkResult],
    inputs: Sequence[torch.Tensor],
    chunk: int,
    keep: torch.Tensor | None = None,
) -> ChunkResult:
    """`fn` over sequence chunks of `chunk` positions, summed: the loss of a vocabulary-sized head without
    its `[B, T, V]` logits.

    Each chunk runs under activation checkpointing (non-reentrant) when gradients are enabled, so only the
    chunk's inputs are kept for backward, and its logits, soft labels and losses are recomputed there, one
    chunk at a time: the memory a vocabulary-sized head adds is that of one chunk, whatever T.

    Args:
        fn: `fn(*chunks) -> (sums [K], counts [K], metrics {name: [K]})`, every chunk `[B, c, ...]` (c <= chunk);
            it may skip its metrics when `recomputing()` (the outputs of a recomputation are discarded).
        inputs: `[B, T, ...]` tensors, sliced along dim 1 (features, labels, masks aligned column by column).
        chunk: positions per chunk (see `chunk_positions`).
        keep: `[B, T]` bool, the positions whose loss can be non-zero (those in some mask), or None for all.
            Only these positions reach `fn`, packed into one row `[1, N, ...]` in their order, `chunk * B` of
            them per chunk (the same tokens per chunk). For an `fn` that treats every position on its own (its
            inputs carry everything a position needs), the result is the same as without `keep`, while the
            prompt and padding positions of a chat batch (a third of the quickstart's) cost no vocabulary-sized
            products.

    Returns:
        The sums over chunks of fn's `(sums, counts, metrics)`.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 position, got {chunk}")
    if keep is not None:
        inputs, chunk = pack_positions(inputs, keep), chunk * keep.shape[0]
    total: ChunkResult | None = None
    for start in range(0, inputs[0].shape[1], chunk):
        parts = [x[:, start : start + chunk] for x in inputs]
        if torch.is_grad_enabled():
            out: ChunkResult = torch.utils.checkpoint.checkpoint(
                fn, *parts, use_reentrant=False, context_fn=_checkpoint_contexts
            )
        else:
            out = fn(*parts)
        if total is None:
            total = out
        else:
            total = (total[0] + out[0], total[1] + out[1], {k: v + out[2][k] for k, v in total[2].items()})
    if total is None:
        raise ValueError("chunked_loss got an empty sequence")
    return total


def pack_positions(inputs: Sequence[torch.Tensor], keep: torch.Tensor) -> list[torch.Tensor]:
    """The positions where `keep [B, T]` is set, of every input `[B, T, ...]`, as one row `[1, N, ...]` (N >= 1:
    with nothing kept, the first position stands in, so `fn` still runs and its masked sums are zero)."""
    if keep.shape != inputs[0].shape[:2]:
        raise ValueError(f"keep is {tuple(keep.shape)}, the inputs' positions {tuple(inputs[0].shape[:2])}")
    if not bool(keep.any()):
        keep = torch.zeros_like(keep)
        keep.view(-1)[0] = True
    return [x[keep].unsqueeze(0) for x in inputs]


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy `[...]` of `logits [..., V]` on `labels [...]`, in float32.

    Over rows of the flattened logits, not `cross_entropy(logits.transpose(1, 2), ...)`: the transposed form
    runs the log-softmax across a strided dimension and hands the head's backward a strided gradient, and on a
    CPU the vocabulary-sized products of that backward ran 3x slower than the forward's
    (docs/BENCHMARKS.md, "Training on the positions that train")."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return ce.view(labels.shape)


@torch.no_grad()
def chunked_argmax(
    fn: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, chunk: int
) -> torch.Tensor:
    """`fn(hidden).argmax(-1)` `[B, T]` (e.g. the target's greedy token from `hidden [B, T, H]`), computed
    `chunk` positions at a time so that only one chunk's logits exist."""
    return torch.cat(
        [fn(hidden[:, s : s + chunk]).argmax(-1) for s in range(0, hidden.shape[1], chunk)], dim=1
    )
