"""`draft.hass_topk` (HASS's harmonized objective): each EAGLE-3 step's soft cross-entropy plus `hass_weight` times
the same sum over the target's k most likely tokens. Checked against a loop over positions, and refused where it
cannot apply."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.losses import eagle3_step_loss
from draftsmith.models.objectives import ObjectiveConfig
from draftsmith.train.eagle import EagleRecipe
from draftsmith.train.eagle_chunks import eagle3_step

B, C, V = 2, 5, 9


def case(seed: int):
    g = torch.Generator().manual_seed(seed)
    t2d = torch.ones(V, dtype=torch.bool)
    t2d[[2, 7]] = False  # two target ids outside the draft vocabulary
    target = torch.randn(B, C, V, generator=g) * 2
    target[0, 0, 2] = 30.0  # one position whose argmax is outside: dropped from the loss
    logits = torch.randn(B, C, int(t2d.sum()), generator=g)
    mask = torch.rand(B, C, generator=g) > 0.2
    return logits, target, mask, t2d


def reference(logits, target, mask, t2d, k, w):
    """The loss sum by a loop: at each trained position whose target argmax is in the draft vocabulary,
    -sum_v p_v log q_v over the draft vocabulary, plus w times that sum over the k largest p_v."""
    total = 0.0
    for b in range(B):
        for t in range(C):
            if not mask[b, t] or not t2d[target[b, t].argmax()]:
                continue
            p = torch.softmax(target[b, t][t2d].double(), -1)
            log_q = torch.log_softmax(logits[b, t].double(), -1)
            total += -(p * log_q).sum().item()
            order = sorted(range(len(p)), key=lambda v: -float(p[v]))[:k]
            total += -w * sum(float(p[v] * log_q[v]) for v in order)
    return total


@pytest.mark.parametrize(("k", "w"), [(1, 1.0), (3, 0.5), (10, 1.0)])
def test_the_top_k_term_equals_a_loop_over_positions(k, w):
    logits, target, mask, t2d = case(k)
    loss, count, hit, alpha = eagle3_step_loss(logits, target, mask, t2d, None, k, w)
    assert loss.item() == pytest.approx(reference(logits, target, mask, t2d, k, w), rel=1e-5)
    plain = eagle3_step_loss(logits, target, mask, t2d)  # the count and metrics do not change
    assert (count, hit, alpha) == (plain[1], plain[2], plain[3])
    assert loss.item() > plain[0].item()  # the added term is a cross-entropy: positive


def test_the_whole_draft_vocabulary_counts_the_loss_twice():
    logits, target, mask, t2d = case(0)
    plain = eagle3_step_loss(logits, target, mask, t2d)[0]
    assert eagle3_step_loss(logits, target, mask, t2d, None, int(t2d.sum()), 1.0)[0].item() == pytest.approx(
        2 * plain.item(), rel=1e-6
    )
    assert eagle3_step_loss(logits, target, mask, t2d, None, 4, 0.0)[0].item() == pytest.approx(plain.item())


def test_a_training_step_reads_it_from_the_draft_config():
    logits, target, mask, t2d = case(1)
    cfg = SimpleNamespace(reach_topk=0, hass_topk=3, hass_weight=0.5, copy_weight=0.0)
    draft: Any = SimpleNamespace(t2d=t2d, config=cfg, logits=lambda h: h)
    loss = eagle3_step(draft, ObjectiveConfig(), logits, target, mask, mask.float())[0]
    assert loss.item() == pytest.approx(reference(logits, target, mask, t2d, 3, 0.5), rel=1e-5)


def test_it_is_off_by_default_and_refused_where_it_cannot_apply():
    assert EagleConfig().hass_topk == 0
    EagleConfig(hass_topk=10, labels="target")
    for bad in (
        dict(hass_topk=10, labels="top1"),  # hard labels: no distribution to take the top-k of
        dict(hass_topk=10, version=1),
        dict(hass_topk=-1),
    ):
        with pytest.raises(ValueError, match="hass_topk"):
            EagleConfig(**bad)
    with pytest.raises(ValueError, match="hass_weight"):
        EagleConfig(hass_topk=10, hass_weight=-1.0)
    with pytest.raises(ValueError, match="objective.loss=null"):
        EagleRecipe(draft=EagleConfig(hass_topk=10), objective=ObjectiveConfig(loss="kl"))
