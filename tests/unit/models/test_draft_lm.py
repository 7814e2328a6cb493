"""The copied-layer draft: the target's first layers, embeddings, norm and head."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama

from draftsmith.models.draft_lm import draft_from_target


@torch.no_grad()
def test_all_layers_copied_is_the_target_and_one_layer_holds_the_targets_own_tensors():
    target = make_tiny_llama(64, layers=3)
    ids = torch.randint(0, 64, (2, 9))
    full = draft_from_target(target, 3)
    torch.testing.assert_close(full(ids).logits, target(ids).logits, atol=0, rtol=0)
    one = draft_from_target(target, 1)
    assert one.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 3
    for name, tensor in one.state_dict().items():
        assert torch.equal(tensor, target.state_dict()[name]), name
    with pytest.raises(ValueError, match="1..3"):
        draft_from_target(target, 4)
