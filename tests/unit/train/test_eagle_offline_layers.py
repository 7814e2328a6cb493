"""A run from a feature cache loads no target layer, unless the draft layer starts from the target's last one
(`draft.layer_init: target`): then it loads them all, and the last one is the target's own."""

from __future__ import annotations

import torch

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.train.eagle import EagleRecipe, offline_target_layers


def test_layer_init_from_the_target_loads_its_last_layer(tiny_toy_target):
    assert offline_target_layers(EagleRecipe()) == 0
    cfg = EagleRecipe(draft=EagleConfig(layer_init="target"))
    partial = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)), layers=0)
    full = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)), layers=offline_target_layers(cfg))
    whole = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    assert not partial.has_layers and full.has_layers
    last, reference = full.decoder.layers[-1].state_dict(), whole.decoder.layers[-1].state_dict()
    assert last.keys() == reference.keys() and all(torch.equal(last[k], reference[k]) for k in last)
