"""Convert peers' EAGLE-3 checkpoints into draftsmith checkpoints, so one evaluator measures everyone.

NVIDIA ModelOpt 0.47 (`EagleExporter` output: model.safetensors + config.json, the layout vLLM / SGLang read):

    fc.weight [H, 3H]                         -> fc.weight
    layers.0.self_attn.{q,k,v,o}_proj.weight  -> layer.self_attn.*      (q/k/v read 2H)
    layers.0.mlp.{gate,up,down}_proj.weight   -> layer.mlp.*
    layers.0.input_layernorm.weight           -> norm_in               (the norm on the token embedding)
    layers.0.hidden_norm.weight               -> norm_hidden
    layers.0.post_attention_layernorm.weight  -> layer.post_attention_layernorm.weight
    norm.weight                               -> norm_final
    lm_head.weight [Vd, H]                    -> lm_head_d (rows reordered by target id)
    d2t [Vd] (draft ids in frequency order)   -> d2t (sorted by target id) and t2d (built: ModelOpt has none)

Layer ids: ModelOpt's `eagle_aux_hidden_state_layer_ids` k is the OUTPUT of decoder layer k, which is
draftsmith's canonical id k + 1 (the input of layer k + 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft

MODELOPT_TO_DRAFTSMITH = {
    "fc.weight": "fc.weight",
    "layers.0.input_layernorm.weight": "norm_in.weight",
    "layers.0.hidden_norm.weight": "norm_hidden.weight",
    "layers.0.post_attention_layernorm.weight": "layer.post_attention_layernorm.weight",
    "norm.weight": "norm_final.weight",
    **{
        f"layers.0.self_attn.{p}.weight": f"layer.self_attn.{p}.weight"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    },
    **{f"layers.0.mlp.{p}.weight": f"layer.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
}


def modelopt_eagle3(src: str | Path, target: Any, out: str | Path, ttt_steps: int = 7) -> Path:
    """Convert a ModelOpt EAGLE-3 export for `target` (a FrozenTarget) into a draftsmith checkpoint at `out`.

    Raises:
        ValueError: a missing or unexpected tensor, a shape that does not fit the target, or a full-vocabulary
            export (whose lm_head is the target's own, untrained).
    """
    src = Path(src)
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    if "d2t" not in state:
        raise ValueError(
            f"{src}: no d2t (a full-vocabulary ModelOpt export); draftsmith converts reduced-vocabulary drafts"
        )
    unexpected = set(state) - set(MODELOPT_TO_DRAFTSMITH) - {"lm_head.weight", "d2t"}
    if unexpected:
        raise ValueError(f"{src}: tensors draftsmith does not know: {sorted(unexpected)}")
    layer_ids = [int(k) + 1 for k in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    d2t = state["d2t"].long()
    vd = d2t.shape[0]
    target_ids = torch.arange(vd) + d2t
    order = torch.argsort(target_ids)  # draftsmith keeps draft ids sorted by target id
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=layer_ids, draft_vocab_size=vd, ttt_steps=ttt_steps),
                        target.model.config, vd)  # fmt: skip
    new_state = {MODELOPT_TO_DRAFTSMITH[k]: v for k, v in state.items() if k in MODELOPT_TO_DRAFTSMITH}
    new_state["lm_head_d.weight"] = state["lm_head.weight"][order]
    sorted_ids = target_ids[order]
    new_state["d2t"] = sorted_ids - torch.arange(vd)
    t2d = torch.zeros(target.vocab_size, dtype=torch.bool)
    t2d[sorted_ids] = True
    new_state["t2d"] = t2d
    missing = set(draft.state_dict()) - set(new_state)
    if missing:
        raise ValueError(f"{src}: the export lacks {sorted(missing)}")
    for k, v in new_state.items():
        if draft.state_dict()[k].shape != v.shape:
            raise ValueError(
                f"{src}: {k} has shape {tuple(v.shape)}, the target needs {tuple(draft.state_dict()[k].shape)}"
            )
    draft.load_state_dict(new_state, strict=True)
    return save_drafter(
        out, draft, target.identity(), extra={"converted_from": {"peer": "modelopt", "path": str(src)}}
    )
