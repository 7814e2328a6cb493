"""`draft.train_on: all`: a training batch's loss mask becomes every real token (the prompts' positions train
too, labelled with the target's own predictions); the held-out batches, which never pass `prepare_batch`, keep
the answers' mask. Counted by hand on a padded batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import pytest
import torch
from conftest import make_tiny_llama

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.target import FrozenTarget
from draftsmith.train.eagle import EagleMethod, _Eagle3Train


def padded_batch() -> dict[str, torch.Tensor]:
    """Row 0: 11 real tokens, answer from 3; row 1: 9 real tokens then padding, answer 2..8."""
    ids = torch.arange(22).view(2, 11) % 13
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[0, 3:] = True
    loss_mask[1, 2:9] = True
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def method(train_on: Literal["answers", "all"]) -> EagleMethod:
    target = FrozenTarget(
        make_tiny_llama(13, layers=4, hidden=32), SimpleNamespace(pad_token_id=0), "tiny-13"
    )
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=3, labels="top1", train_on=train_on)
    draft = _Eagle3Train(cfg, target.model.config, target.vocab_size)
    draft.attach_target(target.embed_tokens, target.head)
    return EagleMethod(target, draft)


def test_all_trains_every_real_position_and_leaves_the_held_out_mask_alone():
    b = padded_batch()
    loss_mask = b["loss_mask"].clone()
    answers, everything = method("answers"), method("all")
    # Step s trains column t when token t+s is trained and position t+s+1 is real. On the answers: row 0 columns
    # 3-s..9-s (7), row 1 columns 2-s..7-s (6): 13 at every step. On every real token: row 0 columns 0..9-s
    # (10 - s), row 1 columns 0..7-s (8 - s).
    assert answers.token_counts(answers.prepare_batch(answers.model, b, 0, 0, 0)).tolist() == [13, 13, 13]
    prepared = everything.prepare_batch(everything.model, b, 0, 0, 0)
    assert everything.token_counts(prepared).tolist() == [18, 16, 14]
    assert prepared["loss_mask"].dtype == torch.bool
    # the held-out path (token_counts and loss_terms on the batch as loaded) counts the answers only
    assert everything.token_counts(b).tolist() == [13, 13, 13]
    assert torch.equal(b["loss_mask"], loss_mask)  # the loaded batch is not changed in place
    sums, _ = everything.loss_terms(everything.model, prepared)
    assert torch.isfinite(sums).all() and (sums > 0).all()


def test_the_prompts_need_the_targets_labels():
    assert EagleConfig().train_on == "answers"
    with pytest.raises(ValueError, match="train_on=all trains the prompts"):
        EagleConfig(version=3, labels="data", train_on="all")
    with pytest.raises(ValueError, match="train_on must be"):
        EagleConfig(version=3, labels="top1", train_on="prompts")  # type: ignore[arg-type]
