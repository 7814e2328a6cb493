"""`draft.reach_topk` (GRIFFIN's token-alignable loss): a TTT step trains a column only where every earlier step's
label was in the draft's top-k there. Checked against a per-position loop, and off by default."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.losses import eagle3_step_loss
from draftsmith.models.objectives import ObjectiveConfig
from draftsmith.train.eagle_chunks import eagle3_data_chunk, eagle3_step

B, C, S, V = 2, 7, 3, 6


def fake_draft(k: int, t2d: torch.Tensor | None = None) -> Any:
    """A drafter whose hidden states are its logits, over a draft vocabulary `t2d` of the target's."""
    t2d = torch.ones(V, dtype=torch.bool) if t2d is None else t2d
    cfg = SimpleNamespace(reach_topk=k, hass_topk=0, hass_weight=1.0, copy_weight=0.0)
    return SimpleNamespace(t2d=t2d, config=cfg, logits=lambda h: h)


def reference(logits, labels, masks, t2d, k):
    """The loss sum per step by a loop over positions: a column trains at step s when it is masked in, its label
    is in the draft vocabulary, and (k > 0) each earlier step's label was in the top-k of that step's logits."""
    to_draft = torch.cumsum(t2d.long(), 0) - 1
    sums = torch.zeros(S)
    for b in range(B):
        for t in range(C):
            reached = True
            for s in range(S):
                label = int(labels[b, t, s])
                if reached and masks[b, t, s] and t2d[label]:
                    sums[s] += -torch.log_softmax(logits[s][b, t], -1)[to_draft[label]]
                top = logits[s][b, t].topk(k).indices.tolist() if k else []
                reached = reached and (not k or (bool(t2d[label]) and int(to_draft[label]) in top))
    return sums


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_data_label_loss_trains_only_reached_columns(k):
    torch.manual_seed(k)
    t2d = torch.tensor([True, True, False, True, True, True])  # target id 2 is outside the draft vocabulary
    vd = int(t2d.sum())
    logits = [torch.randn(B, C, vd) * 2 for _ in range(S)]
    labels = torch.randint(0, V, (B, C, S))
    masks = torch.rand(B, C, S) > 0.2
    sums, counts, metrics = eagle3_data_chunk(fake_draft(k, t2d))(*logits, labels, masks, masks.float())
    assert sums == pytest.approx(reference(logits, labels, masks, t2d, k), abs=1e-5)
    # the counts and the teacher-forced metrics are the same with the mask on or off
    plain = eagle3_data_chunk(fake_draft(0, t2d))(*logits, labels, masks, masks.float())
    assert torch.equal(counts, plain[1]) and torch.equal(metrics["top1"], plain[2]["top1"])
    if k == 1:  # some later column was not reached, so the mask did remove loss
        assert (sums[1:] < plain[0][1:]).all() and sums[0] == pytest.approx(plain[0][0])


def test_a_soft_label_step_drops_unreached_columns_from_the_loss_only():
    torch.manual_seed(0)
    t2d = torch.ones(V, dtype=torch.bool)
    logits, target = torch.randn(B, C, V), torch.randn(B, C, V)
    mask, reached = torch.rand(B, C) > 0.2, torch.rand(B, C) > 0.5
    loss, count, metrics = eagle3_step(
        fake_draft(1, t2d), ObjectiveConfig(), logits, target, mask, mask.float(), reached
    )
    expected = eagle3_step_loss(logits, target, mask & reached, t2d)
    full = eagle3_step_loss(logits, target, mask, t2d)
    assert loss.item() == pytest.approx(expected[0].item(), rel=1e-6)
    assert count.item() == full[1].item() and metrics["top1"].item() == full[2].item()


def test_it_is_eagle3s_option_and_off_by_default():
    assert EagleConfig().reach_topk == 0
    with pytest.raises(ValueError, match="reach_topk is EAGLE-3's"):
        EagleConfig(version=1, reach_topk=1)
    with pytest.raises(ValueError, match="reach_topk is EAGLE-3's"):
        EagleConfig(reach_topk=-1)
