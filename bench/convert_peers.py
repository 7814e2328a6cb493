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

vLLM speculators 0.9 (`Eagle3DraftModel.save_pretrained`: model.safetensors + config.json, what
bench/peers/speculators_eagle3.py writes):

    fc.weight [H, 3H] (no bias)               -> fc.weight
    layers.0.self_attn.{q,k,v,o}_proj.weight  -> layer.self_attn.*      (q/k/v read 2H = cat(embedding, hidden))
    layers.0.mlp.{gate,up,down}_proj.weight   -> layer.mlp.*
    layers.0.input_layernorm.weight           -> norm_in               (applied to the embedding half)
    layers.0.hidden_norm.weight               -> norm_hidden           (applied to the hidden half)
    layers.0.post_attention_layernorm.weight  -> layer.post_attention_layernorm.weight
    norm.weight                               -> norm_final
    lm_head.weight [Vd, H]                    -> lm_head_d (the target's head rows t2d, frozen in training)
    d2t [Vd] (offsets, sorted by target id)   -> d2t (already draftsmith's convention)
    t2d [V] bool                              -> t2d (checked against d2t)
    embed_tokens.weight [V, H]                -> dropped (a frozen copy of the target's; refused if it differs)

Same concatenation order as draftsmith ([norm(embedding) ; norm(hidden)], embedding first), the residual is
the raw hidden state, and the raw layer output feeds the next TTT step; speculators' options that change
this (norm_before_fc, norm_before_residual, norm_output, fc_norm; the first three default to True for eagle3
in speculators 0.9) have no draftsmith equivalent and are refused. Layer ids: speculators/vLLM id k is the
pre-norm residual stream entering decoder layer k, i.e. draftsmith's canonical id k (no shift). The draft
layer's `sliding_window` (2048 by default) is not carried over: draftsmith attends to the whole context,
identical for contexts up to the window.
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
from draftsmith.ship.layouts.common import from_engine_ids

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


def _sorted_vocab(
    lm_head: torch.Tensor, d2t: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(lm_head_d, d2t, t2d)` in draftsmith's convention (draft ids sorted by target id) from a peer's head rows
    and d2t offsets in any draft-id order."""
    d2t = d2t.long()
    vd = d2t.shape[0]
    target_ids = torch.arange(vd) + d2t
    order = torch.argsort(target_ids)  # draftsmith keeps draft ids sorted by target id
    sorted_ids = target_ids[order]
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[sorted_ids] = True
    return lm_head[order], sorted_ids - torch.arange(vd), t2d


def _load_and_save(
    src: Path, out: str | Path, draft: Eagle3Draft, new_state: dict[str, torch.Tensor], target: Any,
    converted_from: dict[str, Any],
) -> Path:  # fmt: skip
    """Check `new_state` against `draft` (complete, shapes that fit the target), load it, save a checkpoint."""
    expected = draft.state_dict()
    missing = set(expected) - set(new_state)
    if missing:
        raise ValueError(f"{src}: the export lacks {sorted(missing)}")
    for k, v in new_state.items():
        if expected[k].shape != v.shape:
            raise ValueError(
                f"{src}: {k} has shape {tuple(v.shape)}, the target needs {tuple(expected[k].shape)}"
            )
    draft.load_state_dict(new_state, strict=True)
    return save_drafter(out, draft, target.identity(), extra={"converted_from": converted_from})


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
    layer_ids = from_engine_ids(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"], "modelopt")
    vd = state["d2t"].shape[0]
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=layer_ids, draft_vocab_size=vd, ttt_steps=ttt_steps),
                        target.model.config, vd)  # fmt: skip
    new_state = {MODELOPT_TO_DRAFTSMITH[k]: v for k, v in state.items() if k in MODELOPT_TO_DRAFTSMITH}
    new_state["lm_head_d.weight"], new_state["d2t"], new_state["t2d"] = _sorted_vocab(
        state["lm_head.weight"], state["d2t"], target.vocab_size
    )
    return _load_and_save(src, out, draft, new_state, target, {"peer": "modelopt", "path": str(src)})


# speculators writes the same vLLM EAGLE-3 (Llama) tensor names as ModelOpt's exporter.
SPECULATORS_TO_DRAFTSMITH = MODELOPT_TO_DRAFTSMITH

# speculators options that change the computation in ways Eagle3Draft cannot express (all must be false).
_SPECULATORS_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")


def speculators_eagle3(src: str | Path, target: Any, out: str | Path, ttt_steps: int = 7) -> Path:
    """Convert a vLLM speculators (0.9) EAGLE-3 checkpoint for `target` (a FrozenTarget) into a draftsmith
    checkpoint at `out`. See the module docstring for the mapping.

    Raises:
        ValueError: a missing or unexpected tensor, a shape that does not fit the target, an embedding copy that
            is not the target's, a d2t/t2d pair that disagree, or a speculators architecture option (or draft
            layer settings) that Eagle3Draft does not compute.
    """
    src = Path(src)
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    if config.get("speculators_model_type") != "eagle3":
        raise ValueError(
            f"{src}: not a speculators EAGLE-3 checkpoint ({config.get('speculators_model_type')!r})"
        )
    on = [f for f in _SPECULATORS_UNSUPPORTED_FLAGS if config.get(f)]
    if on:
        raise ValueError(
            f"{src}: speculators options {on} are set; draftsmith's Eagle3Draft has no equivalent (train with "
            "--no-norm-before-fc --no-norm-before-residual --no-norm-output)"
        )
    layer_cfg = config["transformer_layer_config"]
    tcfg = target.model.config
    if int(layer_cfg.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{src}: {layer_cfg['num_hidden_layers']} draft layers; Eagle3Draft has one")
    if config.get("target_hidden_size") not in (None, target.hidden_size):
        raise ValueError(f"{src}: target_hidden_size {config['target_hidden_size']} != {target.hidden_size}")
    for key in ("hidden_act", "rms_norm_eps", "head_dim", "num_attention_heads", "num_key_value_heads"):
        if key in layer_cfg and getattr(tcfg, key, None) is not None and layer_cfg[key] != getattr(tcfg, key):
            raise ValueError(
                f"{src}: draft layer {key}={layer_cfg[key]!r}, the target's is {getattr(tcfg, key)!r}"
            )
    theta = (layer_cfg.get("rope_parameters") or {}).get("rope_theta", layer_cfg.get("rope_theta"))
    t_theta = (getattr(tcfg, "rope_parameters", None) or {}).get(
        "rope_theta", getattr(tcfg, "rope_theta", None)
    )
    if theta is not None and t_theta is not None and float(theta) != float(t_theta):
        raise ValueError(f"{src}: draft rope_theta {theta}, the target's {t_theta}")
    known = set(SPECULATORS_TO_DRAFTSMITH) | {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"}
    unexpected = set(state) - known
    if unexpected:
        raise ValueError(f"{src}: tensors draftsmith does not know: {sorted(unexpected)}")
    embed = state.get("embed_tokens.weight")  # compared in the checkpoint's dtype (the trainer saves bf16)
    if embed is not None and not torch.equal(
        embed, target.embed_tokens.weight.detach().cpu().to(embed.dtype)
    ):
        raise ValueError(
            f"{src}: embed_tokens.weight is not the target's embedding; draftsmith uses the target's"
        )
    if not config.get("eagle_aux_hidden_state_layer_ids"):
        raise ValueError(f"{src}: no eagle_aux_hidden_state_layer_ids (the target layers the draft reads)")
    layer_ids = from_engine_ids(config["eagle_aux_hidden_state_layer_ids"], "speculators")
    vd = int(config["draft_vocab_size"])
    if "d2t" in state:
        d2t = state["d2t"].long()
        if "t2d" not in state or not torch.equal(
            state["t2d"].bool().nonzero().flatten(), (torch.arange(d2t.shape[0]) + d2t).sort().values
        ):
            raise ValueError(f"{src}: t2d does not mark the target ids of d2t")
    elif vd == target.vocab_size:  # full vocabulary: speculators saves no mapping
        d2t = torch.zeros(vd, dtype=torch.long)
    else:
        raise ValueError(f"{src}: draft_vocab_size {vd} < the target's {target.vocab_size} but no d2t")
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=layer_ids, draft_vocab_size=vd, ttt_steps=ttt_steps),
                        tcfg, vd)  # fmt: skip
    new_state = {SPECULATORS_TO_DRAFTSMITH[k]: v for k, v in state.items() if k in SPECULATORS_TO_DRAFTSMITH}
    new_state["lm_head_d.weight"], new_state["d2t"], new_state["t2d"] = _sorted_vocab(
        state["lm_head.weight"], d2t, target.vocab_size
    )
    converted_from = {"peer": "speculators", "path": str(src), "speculators_version": config.get("speculators_version"),
                      "sliding_window": layer_cfg.get("sliding_window")}  # fmt: skip
    return _load_and_save(src, out, draft, new_state, target, converted_from)
