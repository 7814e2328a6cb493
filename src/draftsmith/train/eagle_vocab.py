"""EAGLE-3's and P-EAGLE's vocabulary scan: how often each token is a label in the training data, from which
`build_vocab_map` (models/eagle3.py) keeps the `draft.draft_vocab_size` most frequent."""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.models.target import TOP1, feature_key
from draftsmith.train.core.data import tokens_view


def assistant_token_counts(dataset: object, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained (assistant) token in `dataset` (EAGLE-3's vocabulary scan)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    view = tokens_view(dataset)
    for i in range(len(view)):
        sample = view[i]
        ids = torch.as_tensor(sample["input_ids"])[torch.as_tensor(sample["loss_mask"]).bool()]
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def label_token_counts(dataset: object, vocab_size: int, labels: str) -> torch.Tensor:
    """How often each token id is a label (EAGLE-3's vocabulary scan): the trained tokens of the data, or with
    `draft.labels: top1` and a cache that holds them, the target's greedy tokens that predict them (on text the
    target did not write, the tokens it would say are the ones to keep in the draft vocabulary)."""
    layers = getattr(dataset, "layers", [])
    if labels != "top1" or TOP1 not in layers:
        return assistant_token_counts(dataset, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    view: Any = dataset.only([TOP1])  # type: ignore[attr-defined]
    for i in range(len(view)):
        sample = view[i]
        counts += torch.bincount(
            sample[feature_key(TOP1)][:-1][sample["loss_mask"][1:]], minlength=vocab_size
        )
    return counts
