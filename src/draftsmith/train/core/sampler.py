"""Which samples each rank trains on at each optimizer step.

The loop owns the data order instead of handing a DataLoader to accelerate because two guarantees depend
on it: (1) an optimizer step sees the same global batch whatever the split into ranks x accumulation
(2 ranks x micro-batch 2 == 1 rank x micro-batch 2 x accumulation 2), and (2) resuming at step s needs no
replay of the data: the position is a pure function of (seed, step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Length grouping sorts each window of this many steps' samples by length: wide enough that a step's samples
# are close in length, narrow enough that each window is still a random draw of the data.
GROUP_STEPS = 32


class StepSchedule:
    """Deterministic per-step, per-rank micro-batches over a dataset of `num_samples` items.

    Each epoch is a fresh permutation drawn from `seed + epoch`; an optimizer step takes the next
    `micro_batch_size * grad_accum * world_size` indices of it (the tail of an epoch that does not fill a
    step is skipped). Within a step, micro-batch j of rank r is the slice number `j * world_size + r`.

    Args:
        num_samples: dataset length.
        micro_batch_size: samples per forward pass on one rank.
        grad_accum: micro-batches per optimizer step on one rank.
        world_size: number of ranks.
        seed: shuffling seed.
        shuffle: False keeps dataset order (epochs then repeat identically).
        lengths: per-sample lengths to group by (`train.group_by_length`), or None. Each epoch's permutation is
            then cut into windows of `GROUP_STEPS` steps, each window sorted by length and split into steps,
            and the steps shuffled: a step's samples are close in length (the collator pads to the longest),
            the order of steps stays random, and an epoch still trains the same samples as without grouping.
            (transformers' LengthGroupedSampler sorts the same way but leaves the batches of a window in
            length order, a curriculum inside every window.)
    """

    def __init__(
        self,
        num_samples: int,
        micro_batch_size: int,
        grad_accum: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        lengths: Sequence[int] | None = None,
    ):
        self.num_samples = num_samples
        self.micro_batch_size = micro_batch_size
        self.grad_accum = grad_accum
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.samples_per_step = micro_batch_size * grad_accum * world_size
        if num_samples < self.samples_per_step:
            raise ValueError(
                f"the training set has {num_samples} samples but one optimizer step needs "
                f"{self.samples_per_step} (micro_batch_size {micro_batch_size} x grad_accum {grad_accum} x "
                f"{world_size} processes): add data or lower train.micro_batch_size / train.grad_accum"
            )
        self.steps_per_epoch = num_samples // self.samples_per_step
        if lengths is not None and len(lengths) != num_samples:
            raise ValueError(f"got {len(lengths)} sample lengths for {num_samples} samples")
        self.lengths = None if lengths is None else torch.as_tensor(list(lengths), dtype=torch.long)
        self._epoch = -1
        self._perm = torch.arange(num_samples)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            self._epoch = epoch
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                self._perm = torch.randperm(self.num_samples, generator=g)
            else:
                g, self._perm = None, torch.arange(self.num_samples)
            if self.lengths is not None:
                self._perm = self._grouped(self._perm, g)
        return self._perm

    def _grouped(self, perm: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        """`perm` with its trained part (the whole steps) regrouped by length (see `lengths` above); the tail
        that fills no step, which an epoch skips, stays the same."""
        assert self.lengths is not None
        n = self.steps_per_epoch * self.samples_per_step
        window = GROUP_STEPS * self.samples_per_step
        steps = []
        for start in range(0, n, window):
            part = perm[start : min(n, start + window)]
            order = torch.sort(self.lengths[part], descending=True, stable=True).indices
            steps += list(part[order].split(self.samples_per_step))
        order = torch.randperm(len(steps), generator=g) if g is not None else torch.arange(len(steps))
        return torch.cat([steps[i] for i in order.tolist()] + [perm[n:]])

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def micro_batches(self, step: int, rank: int) -> list[list[int]]:
        """Indices of the `grad_accum` micro-batches that `rank` trains on at optimizer step `step` (0-based)."""
        perm = self._permutation(self.epoch_of(step))
        start = (step % self.steps_per_epoch) * self.samples_per_step
        window = perm[start : start + self.samples_per_step]
        mb = self.micro_batch_size
        return [
            window[(j * self.world_size + rank) * mb : (j * self.world_size + rank + 1) * mb].tolist()
            for j in range(self.grad_accum)
        ]
