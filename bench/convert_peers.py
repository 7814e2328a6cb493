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

DFlash, z-lab's layout (`DFlashDraftModel`: model.safetensors + config.json), which NVIDIA ModelOpt 0.47's
`DFlashExporter` writes and draftsmith's own SGLang export (`dflash_sglang`) writes: the tensor names are
draftsmith's (`fc`, `hidden_norm`, `layers.{i}.*` with q/k norms, `norm`) and carry over unchanged. The
config gives the block size, the mask token and `dflash_config.target_layer_ids`, which name layer OUTPUTS:
z-lab id j is draftsmith's canonical id j + 1. Refused: a causal block, a sliding window, attention sinks,
rope scaling, and draft-layer settings other than the target's (draftsmith's DFlash layers take the target's
dimensions, eps and rope).

DFlash, vLLM speculators 0.9's layout (`DFlashDraftModel.save_pretrained`, what bench/peers/speculators_dflash.py
and draftsmith's own vLLM export `dflash_speculators` write): the same tensor names, plus (draftsmith's export)
the target's embedding and LM head and an identity vocabulary map, checked and dropped. The draft layers'
settings sit in `transformer_layer_config`; `aux_hidden_state_layer_ids` are canonical ids. Refused besides:
`sample_from_anchor` (slot 0 drafted too), a reduced draft vocabulary, and speculators' default sliding-window
draft layers (they attend causally inside the block).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.dflash import DFlashConfig, DFlashDraft
from draftsmith.models.draft_layer import draft_layer_settings
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
    src: Path,
    out: str | Path,
    draft: torch.nn.Module,
    new_state: dict[str, torch.Tensor],
    target: Any,
    converted_from: dict[str, Any],
) -> Path:
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
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=layer_ids, draft_vocab_size=vd, ttt_steps=ttt_steps),
        target.model.config,
        vd,
    )
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
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=layer_ids, draft_vocab_size=vd, ttt_steps=ttt_steps), tcfg, vd
    )
    new_state = {SPECULATORS_TO_DRAFTSMITH[k]: v for k, v in state.items() if k in SPECULATORS_TO_DRAFTSMITH}
    new_state["lm_head_d.weight"], new_state["d2t"], new_state["t2d"] = _sorted_vocab(
        state["lm_head.weight"], d2t, target.vocab_size
    )
    converted_from = {
        "peer": "speculators",
        "path": str(src),
        "speculators_version": config.get("speculators_version"),
        "sliding_window": layer_cfg.get("sliding_window"),
    }
    return _load_and_save(src, out, draft, new_state, target, converted_from)


def _rope_theta(config: Any) -> float | None:
    """rope_theta from a config dict or a transformers config (top level or `rope_parameters`)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    theta = (get("rope_parameters") or {}).get("rope_theta", get("rope_theta"))
    return None if theta is None else float(theta)


def zlab_dflash(src: str | Path, target: Any, out: str | Path, peer: str = "modelopt") -> Path:
    """Convert a DFlash export in z-lab's layout (ModelOpt's `DFlashExporter`, draftsmith's `dflash_sglang`) for
    `target` (a FrozenTarget) into a draftsmith DFlash checkpoint at `out`. See the module docstring.

    Raises:
        ValueError: not a DFlash export, a missing or unexpected tensor, a shape, layer id or setting that does
            not fit the target, or an attention variant (causal block, sliding window, sinks) or rope scaling
            that DFlashDraft does not compute.
    """
    src = Path(src)
    config = json.loads((src / "config.json").read_text())
    if "DFlashDraftModel" not in (config.get("architectures") or []) or "dflash_config" not in config:
        raise ValueError(f"{src}: not a z-lab DFlash export (architectures {config.get('architectures')})")
    dc = config["dflash_config"]
    block = dc.get("block_size", config.get("block_size"))
    if block is None or int(config.get("block_size", block)) != int(block):
        raise ValueError(
            f"{src}: block_size {config.get('block_size')} vs dflash_config {dc.get('block_size')}"
        )
    unsupported = {
        "a causal block (dflash_config.causal)": dc.get("causal"),
        "a sliding window": dc.get("use_swa"),
        "attention sinks": dc.get("attention_sink_bias") or config.get("attention_sink_bias"),
    }
    if config.get("num_target_layers") not in (None, target.num_layers):
        raise ValueError(
            f"{src}: drafted for a {config['num_target_layers']}-layer target, not {target.num_layers}"
        )
    canonical = from_engine_ids(dc["target_layer_ids"], "sglang")  # z-lab id j = output of layer j
    converted_from = {
        "peer": peer,
        "path": str(src),
        "layout": "z-lab DFlashDraftModel",
        "target_layer_ids": list(dc["target_layer_ids"]),
    }
    state = load_file(str(src / "model.safetensors"))
    return _dflash(
        src,
        state,
        config,
        unsupported,
        canonical,
        dc["target_layer_ids"],
        int(dc["mask_token_id"]),
        int(block),
        target,
        out,
        converted_from,
    )


def speculators_dflash(src: str | Path, target: Any, out: str | Path) -> Path:
    """Convert vLLM speculators 0.9's DFlash checkpoint (`DFlashDraftModel.save_pretrained`, what
    bench/peers/speculators_dflash.py and draftsmith's `dflash_speculators` export write) into a draftsmith
    DFlash checkpoint at `out`. The layer tensors are named as draftsmith's; `aux_hidden_state_layer_ids` are
    canonical ids (vLLM's convention); the draft layers' settings sit in `transformer_layer_config`. Refused, on
    top of `zlab_dflash`'s refusals: drafting from the anchor (`sample_from_anchor`) and a reduced draft
    vocabulary (draftsmith's DFlash drafts every token).
    """
    src = Path(src)
    config = json.loads((src / "config.json").read_text())
    if config.get("speculators_model_type") != "dflash":
        raise ValueError(
            f"{src}: not a speculators DFlash checkpoint "
            f"(speculators_model_type {config.get('speculators_model_type')!r})"
        )
    layer = config["transformer_layer_config"]
    state = load_file(str(src / "model.safetensors"))
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    reduced = (
        int(config.get("draft_vocab_size") or target.vocab_size) != target.vocab_size
        or (d2t is not None and bool(d2t.any()))
        or (t2d is not None and not bool(t2d.all()))
    )
    unsupported = {
        "drafting from the anchor (sample_from_anchor)": config.get("sample_from_anchor"),
        "a reduced draft vocabulary": reduced,
    }
    ids = config["aux_hidden_state_layer_ids"]
    converted_from = {
        "peer": "speculators",
        "path": str(src),
        "layout": "speculators DFlashDraftModel",
        "aux_hidden_state_layer_ids": list(ids),
    }
    return _dflash(
        src,
        state,
        layer,
        unsupported,
        from_engine_ids(ids, "vllm"),
        ids,
        int(config["mask_token_id"]),
        int(config["block_size"]),
        target,
        out,
        converted_from,
    )


def _dflash(
    src: Path,
    state: dict[str, torch.Tensor],
    layer: dict[str, Any],
    unsupported: dict[str, Any],
    canonical: list[int],
    ids: list[int],
    mask: int,
    block: int,
    target: Any,
    out: str | Path,
    converted_from: dict[str, Any],
) -> Path:
    """The checks and the conversion both DFlash layouts share: `layer` holds the draft layers' settings,
    `unsupported` the layout's own refusals, `ids` the layer ids as the layout writes them (for messages),
    `state` the layout's tensors less those the caller already checked."""
    rope = layer.get("rope_scaling")
    unsupported = {
        **unsupported,
        "a sliding window": unsupported.get("a sliding window")
        or (layer.get("use_sliding_window") and layer.get("sliding_window"))
        or any(t != "full_attention" for t in layer.get("layer_types") or []),
        "rope scaling": rope not in (None, {}) and rope.get("rope_type", rope.get("type")) != "default",
    }
    on = [name for name, value in unsupported.items() if value]
    if on:
        raise ValueError(f"{src}: {', '.join(on)}; draftsmith's DFlashDraft has no equivalent")
    if layer.get("vocab_size") not in (None, target.vocab_size):
        raise ValueError(f"{src}: vocab_size {layer['vocab_size']}, the target's is {target.vocab_size}")
    settings = draft_layer_settings(target.model.config)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "hidden_act",
        "attention_bias",
    ):
        if key in layer and layer[key] != settings[key]:
            raise ValueError(
                f"{src}: draft {key}={layer[key]!r}, draftsmith's DFlash layers use {settings[key]!r}"
            )
    theta, t_theta = _rope_theta(layer), _rope_theta(settings)
    if theta is not None and t_theta is not None and theta != t_theta:
        raise ValueError(f"{src}: draft rope_theta {theta}, the target's {t_theta}")
    bad = [c for c in canonical if not 1 <= c <= target.num_layers]
    if bad:
        raise ValueError(f"{src}: layer ids {list(ids)} name no layer of the target")
    if not 0 <= mask < int(target.embed_tokens.weight.shape[0]):
        raise ValueError(f"{src}: mask_token_id {mask} is not a row of the target's embedding")
    for name, ours in (
        ("embed_tokens.weight", target.embed_tokens.weight),
        ("lm_head.weight", target.lm_head.weight),
    ):
        theirs = state.pop(name, None)  # z-lab's layout has neither; a copy must be the target's own
        if theirs is not None and not torch.equal(theirs, ours.detach().cpu().to(theirs.dtype)):
            raise ValueError(f"{src}: {name} is not the target's; draftsmith's DFlash uses the target's")
    layers = int(layer["num_hidden_layers"])
    draft = DFlashDraft(
        DFlashConfig(
            block_size=block,
            num_layers=layers,
            feature_layers=canonical,
            num_feature_layers=len(canonical),
            mask_token_id=mask,
        ),
        target.model.config,
        target.vocab_size,
    )
    unexpected = set(state) - set(draft.state_dict())
    if unexpected:
        raise ValueError(f"{src}: tensors draftsmith does not know: {sorted(unexpected)}")
    new_state = {k: v.to(draft.state_dict()[k].dtype) for k, v in state.items()}
    return _load_and_save(src, out, draft, new_state, target, converted_from)


def modelopt_dflash(src: str | Path, target: Any, out: str | Path) -> Path:
    """Convert ModelOpt 0.47's DFlash export (`DFlashExporter`, z-lab's layout); see `zlab_dflash`."""
    return zlab_dflash(src, target, out, peer="modelopt")
