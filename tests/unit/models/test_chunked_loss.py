"""The chunked loss helper: sums equal the one-shot computation, gradients too, and nothing vocabulary-sized is
kept for backward; metrics are skipped only while a chunk is recomputed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.chunking import (
    ChunkResult,
    chunk_positions,
    chunked_argmax,
    chunked_loss,
    pack_positions,
    recomputing,
)
from draftsmith.models.losses import shift_columns

B, T, H, V = 2, 11, 6, 37


def head_and_inputs() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    return head, hidden, labels, mask


def ce_chunk(head: torch.nn.Linear, calls: list[bool]) -> Callable[..., ChunkResult]:
    def fn(h: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> ChunkResult:
        calls.append(recomputing())
        logits = head(h).float()
        ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        hits = torch.zeros(1) if recomputing() else ((logits.argmax(-1) == labels) & mask).sum().float()[None]
        return (ce * mask).sum()[None], mask.sum().float()[None], {"top1": hits}

    return fn


def assert_one_shot(
    head, hidden, labels, mask, run: Callable[[], tuple[torch.Tensor, torch.Tensor, dict]]
) -> None:
    """`run()`'s sums, counts and top-1, and their gradients, equal the one-shot loss over every position."""
    logits = head(hidden)  # the old way: [B, T, V] at once
    ref = (F.cross_entropy(logits.transpose(1, 2), labels, reduction="none") * mask).sum()
    ref_grads = torch.autograd.grad(ref, [hidden, head.weight])
    sums, counts, metrics = run()
    grads = torch.autograd.grad(sums.sum(), [hidden, head.weight])
    torch.testing.assert_close(sums[0], ref, rtol=1e-6, atol=0)
    assert float(counts[0]) == float(mask.sum())
    assert float(metrics["top1"][0]) == float(((logits.argmax(-1) == labels) & mask).sum())
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("chunk", [1, 4, T, 100])
def test_chunked_sums_and_gradients_equal_the_one_shot_loss(chunk):
    head, hidden, labels, mask = head_and_inputs()
    calls: list[bool] = []
    assert_one_shot(
        head, hidden, labels, mask, lambda: chunked_loss(ce_chunk(head, calls), (hidden, labels, mask), chunk)
    )
    n = -(-T // chunk)
    assert calls == [False] * n + [True] * n  # each chunk ran once forward and once recomputed for backward


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_kept_positions_alone_give_the_same_loss_gradients_and_metrics(chunk):
    """`keep`: only the masked positions reach fn, packed into one row, and the sums, counts, top-1 and
    gradients are the one-shot loss's over every position."""
    head, hidden, labels, mask = head_and_inputs()
    seen: list[tuple[int, ...]] = []
    inner = ce_chunk(head, [])

    def fn(h: torch.Tensor, lab: torch.Tensor, m: torch.Tensor) -> ChunkResult:
        if not recomputing():
            seen.append(tuple(h.shape))
        return inner(h, lab, m)

    assert_one_shot(
        head, hidden, labels, mask, lambda: chunked_loss(fn, (hidden, labels, mask), chunk, keep=mask)
    )
    n = int(mask.sum())
    assert all(shape[0] == 1 and shape[1] <= chunk * B for shape in seen)  # one row, chunk * B per chunk
    assert sum(shape[1] for shape in seen) == n < B * T


def test_packing_keeps_order_and_runs_fn_when_nothing_is_kept():
    x = torch.arange(12).reshape(2, 6)
    keep = torch.tensor([[0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert [t.tolist() for t in pack_positions([x, x * 10], keep)] == [[[1, 2, 6, 11]], [[10, 20, 60, 110]]]
    head, hidden, labels, _ = head_and_inputs()
    nothing = torch.zeros(B, T, dtype=torch.bool)
    sums, counts, _ = chunked_loss(ce_chunk(head, []), (hidden, labels, nothing), 4, keep=nothing)
    assert float(sums[0]) == 0.0 and float(counts[0]) == 0.0
    assert float(torch.autograd.grad(sums.sum(), hidden)[0].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="keep is"):
        pack_positions([x], keep[:, :3])


def test_no_vocabulary_sized_tensor_is_kept_for_backward():
    head, hidden, labels, mask = head_and_inputs()
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sums, _, _ = chunked_loss(ce_chunk(head, []), (hidden, labels, mask), 3)
    assert saved and not [s for s in saved if V in s], saved
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(head(hidden).transpose(1, 2), labels)  # unchunked: its logits are kept
    assert [s for s in saved if V in s]


def test_without_gradients_each_chunk_runs_once_and_nothing_is_recomputed():
    head, hidden, labels, mask = head_and_inputs()
    calls: list[bool] = []
    with torch.no_grad():
        sums, _, _ = chunked_loss(ce_chunk(head, calls), (hidden, labels, mask), 4)
    assert calls == [False, False, False] and sums.grad_fn is None


def test_chunked_argmax_and_helpers():
    head, hidden, _, _ = head_and_inputs()
    torch.testing.assert_close(chunked_argmax(head, hidden, 3), head(hidden).argmax(-1))
    assert chunk_positions(4, 1024) == 256 and chunk_positions(3000, 1024) == 1
    with pytest.raises(ValueError):
        chunk_positions(1, 0)
    with pytest.raises(ValueError):
        chunked_loss(ce_chunk(head, []), (hidden,), 0)
    x = torch.arange(10).reshape(2, 5)
    assert shift_columns(x, 2).tolist() == [[2, 3, 4, 0, 0], [7, 8, 9, 0, 0]]
    assert shift_columns(x, 7).tolist() == [[0] * 5, [0] * 5]
