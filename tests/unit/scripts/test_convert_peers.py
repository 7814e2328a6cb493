"""ModelOpt EAGLE-3 exports convert into draftsmith checkpoints that compute the same thing."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from draftsmith.models.checkpoint import load_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.scripts.convert_peers import MODELOPT_TO_DRAFTSMITH, modelopt_eagle3


def test_modelopt_export_round_trips_through_the_converter(tiny_random_target, tmp_path):
    """Oracle: write a draftsmith draft out in ModelOpt's layout (draft ids in frequency order, layer ids as
    outputs of layers), convert it back, and get identical target-id logits."""
    target = tiny_random_target
    V, vd = target.vocab_size, 40
    torch.manual_seed(0)
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=[2, 3, 4], ttt_steps=2), target.model.config, vd
    )
    used = torch.randperm(V)[:vd]  # frequency order: not sorted by target id
    inverse = {v: k for k, v in MODELOPT_TO_DRAFTSMITH.items()}
    state = {inverse[k]: v for k, v in draft.state_dict().items() if k in inverse}
    state["lm_head.weight"] = draft.lm_head_d.weight.detach().clone()
    state["d2t"] = used - torch.arange(vd)
    src = tmp_path / "modelopt"
    src.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(src / "model.safetensors"))
    (src / "config.json").write_text(
        json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})
    )

    loaded, config = load_drafter(modelopt_eagle3(src, target, tmp_path / "converted"), target)
    assert config["feature_layers"] == [2, 3, 4]  # ModelOpt's output of layer k is draftsmith's id k+1
    assert torch.equal(loaded.t2d.nonzero().flatten(), used.sort().values)
    draft.attach_target(target.embed_tokens, target.lm_head)
    g = torch.randn(1, 5, 3 * target.hidden_size)
    ids = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        ref = draft.unroll(g, ids)[1][0]  # [T, vd] in the export's draft order
        got = loaded.unroll(g, ids)[1][0]
    # the same distribution over TARGET ids, whatever the draft-id order
    full_ref = torch.full((5, V), -1e9).index_copy(1, used, ref)
    full_got = torch.full((5, V), -1e9).index_copy(1, loaded.to_target_ids(torch.arange(vd)), got)
    torch.testing.assert_close(full_got, full_ref)
