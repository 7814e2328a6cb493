"""EAGLE-3 and EAGLE-1 in the layouts engines load (ENGINES.md 6.1, 6.2).

EAGLE-3, draftsmith name -> official / SGLang name (`--to sglang`, `--to hf`) -> speculators name (`--to vllm`):

    fc.weight [H, 3H]                          fc.weight                              fc.weight
    layer.self_attn.{q,k,v}_proj [.., 2H]      midlayer.self_attn.*                   layers.0.self_attn.*
    layer.self_attn.o_proj, layer.mlp.*        midlayer.*                             layers.0.*
    norm_in (on the token embedding)           midlayer.input_layernorm.weight        layers.0.input_layernorm.weight
    norm_hidden (on the hidden state)          midlayer.hidden_norm.weight            layers.0.hidden_norm.weight
    layer.post_attention_layernorm             midlayer.post_attention_layernorm      layers.0.post_attention_layernorm
    layer.self_attn.{q,k}_norm (draft.layer:   absent: SGLang serves Llama layers     layers.0.self_attn.{q,k}_norm
      qwen3 only)                              only, the export is refused            (transformer_layer_config qwen3)
    later.{k}.* (draft.num_layers > 1:         absent: SGLang serves one layer, the   layers.{k+1}.* incl. input_layernorm
      standard Llama layers on H)              export is refused                      (q/k/v read H; num_hidden_layers N)
    norm_final                                 norm.weight                            norm.weight
    lm_head_d [Vd, H]                          lm_head.weight                         lm_head.weight
    d2t [Vd] int64 offsets, t2d [V] bool       d2t, t2d                               d2t, t2d (none when Vd = V)
    (the target's embedding, never saved)      absent: SGLang uses the target's       absent: vLLM shares the target's

Layer ids: SGLang's config carries canonical - 1, the speculators config canonical ids (common.LAYER_ID_OFFSETS).

EAGLE-1 (`eagle`), the official SafeAILab layout (`LlamaForCausalLMEagle`; for vLLM `LlamaForCausalLM`):

    fc.weight [H, 2H], fc.bias [H]             fc.weight, fc.bias    SGLang's fc always has a bias: a zero bias is
                                                                     written when draft.fc_bias was off; vLLM's fc
                                                                     has none (0.32): no fc.bias, and a trained
                                                                     non-zero bias refuses the vLLM export
    layer.self_attn.*, layer.mlp.*,            layers.0.*            layer 0 has no input_layernorm (the engines
    layer.post_attention_layernorm                                   replace it by the identity)
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.models.draft_layer import draft_layer_config, draft_layer_settings
from draftsmith.models.serving import SUMMARY

from .common import (
    Export,
    ExportError,
    LayoutSpec,
    to_engine_ids,
    vllm_serve,
    vllm_speculative,
    without_identity_vocab_map,
)
from .target_info import TargetInfo, rope_settings


def _prefix_map(state: dict[str, torch.Tensor], renames: dict[str, str]) -> dict[str, torch.Tensor]:
    """Rename by prefix: the first matching `old -> new` prefix wins; names with no match are kept."""
    out = {}
    for name, tensor in state.items():
        for old, new in renames.items():
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        out[name] = tensor
    return out


def layer_shapes(
    target: TargetInfo, prefix: str, attn_in: int, input_norm: bool, layer: str = "llama"
) -> dict[str, tuple[int, ...]]:
    """The tensors of the Llama-style draft layer engines serve (models/draft_layer.py) for `target`, with q/k/v
    reading `attn_in` features (plus per-head q/k norms for speculators' qwen3 layer). No biases: the engines'
    draft layers have none."""
    c = draft_layer_settings(target.config)
    H, nh, nkv, hd, inter = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["intermediate_size"],
    )
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}self_attn.q_proj.weight": (nh * hd, attn_in),
        f"{prefix}self_attn.k_proj.weight": (nkv * hd, attn_in),
        f"{prefix}self_attn.v_proj.weight": (nkv * hd, attn_in),
        f"{prefix}self_attn.o_proj.weight": (H, nh * hd),
        f"{prefix}mlp.gate_proj.weight": (inter, H),
        f"{prefix}mlp.up_proj.weight": (inter, H),
        f"{prefix}mlp.down_proj.weight": (H, inter),
        f"{prefix}post_attention_layernorm.weight": (H,),
    }
    if input_norm:
        shapes[f"{prefix}input_layernorm.weight"] = (H,)
    if layer == "qwen3":
        shapes[f"{prefix}self_attn.q_norm.weight"] = (hd,)
        shapes[f"{prefix}self_attn.k_norm.weight"] = (hd,)
    return shapes


def later_layers(state: dict[str, torch.Tensor]) -> int:
    """How many layers follow the fused first one (`later.{k}.*`: `draft.num_layers` - 1; P-EAGLE's too)."""
    return len({name.split(".")[1] for name in state if name.startswith("later.")})


def draft_layer_count(source: dict[str, Any]) -> int:
    """The drafter's decoder layers by its config (`draft.num_layers`; checkpoints before the option have one)."""
    return int(source["config"]["drafter"].get("num_layers", 1))


def draft_layer_kind(source: dict[str, Any]) -> str:
    """The checkpoint's draft decoder layer (`draft.layer`; checkpoints before the option are Llama)."""
    return str(source["config"]["drafter"].get("layer", "llama"))


def _layer_config(target: TargetInfo) -> dict[str, Any]:
    """The draft layer's config as engines read it (legacy rope keys), from the one source of these values."""
    settings = dict(draft_layer_settings(target.config))
    rope = rope_settings({"rope_parameters": settings.pop("rope_parameters")})
    return {**settings, **rope, "vocab_size": target.vocab_size}


def _layer_spec_config(target: TargetInfo, prefix: str = "") -> dict[str, Any]:
    """The config values an engine's draft layer reads, which must equal the target's."""
    return {prefix + k: v for k, v in _layer_config(target).items()}


def _eagle3_common(
    source: dict[str, Any], target: TargetInfo, engine: str, layer: str
) -> tuple[list[int], list[int], int, dict[str, torch.Tensor], LayoutSpec]:
    """What both EAGLE-3 layouts share: `(canonical ids, engine ids, draft vocabulary size, tensors renamed with
    the draft layer under `layer`, the spec of those tensors)`. Each layout adds its config and config checks."""
    canonical = [int(i) for i in source["config"]["feature_layers"]]
    if later_layers(source["state"]) and engine != "vllm":
        raise ExportError(
            f"{engine} serves EAGLE-3 heads of one layer (midlayer); this one has {draft_layer_count(source)} "
            "(draft.num_layers): export it with --to vllm, or retrain with draft.num_layers=1"
        )
    ids = to_engine_ids(canonical, engine, target.num_layers)
    vd, H, V = int(source["config"]["draft_vocab_size"]), target.hidden_size, target.vocab_size
    tensors = _prefix_map(
        source["state"],
        {
            "layer.": layer,
            # the later layers (draft.num_layers > 1) are layers 1..N-1 of the speculators layout
            **{f"later.{k}.": f"layers.{k + 1}." for k in range(later_layers(source["state"]))},
            "norm_in.": layer + "input_layernorm.",
            "norm_hidden.": layer + "hidden_norm.",
            "norm_final.": "norm.",
            "lm_head_d.": "lm_head.",
        },
    )
    kind = draft_layer_kind(source)
    later = {  # from the drafter's config, so that a checkpoint missing a layer's tensors is refused
        name: shape
        for k in range(1, draft_layer_count(source))
        for name, shape in layer_shapes(target, f"layers.{k}.", H, input_norm=True, layer=kind).items()
    }
    spec = LayoutSpec(
        tensors={
            **layer_shapes(target, layer, 2 * H, input_norm=True, layer=kind),
            **later,
            layer + "hidden_norm.weight": (H,),
            "d2t": (vd,),
            "t2d": (V,),
            "lm_head.weight": (vd, H),
            "norm.weight": (H,),
            "fc.weight": (H, 3 * H),
        },
        optional={"embed_tokens.weight": (V, H)},
        draft_vocab=("d2t", "t2d", vd),
        dtypes={"d2t": torch.int64, "t2d": torch.bool},
    )
    return canonical, ids, vd, tensors, spec


def eagle3_sglang(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """EAGLE-3 -> the official / SGLang layout (`LlamaForCausalLMEagle3`, `midlayer.*`)."""
    if draft_layer_kind(source) != "llama":
        raise ExportError(
            f"{engine} serves EAGLE-3 heads only with a Llama draft layer; this one was trained with "
            f"draft.layer={draft_layer_kind(source)} ({SUMMARY}): export it with --to vllm, or retrain with "
            "draft.layer=llama"
        )
    canonical, ids, vd, tensors, spec = _eagle3_common(source, target, "sglang", "midlayer.")
    state, H = source["state"], target.hidden_size
    eagle_config = {
        "eagle_aux_hidden_state_layer_ids": ids,
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
    }
    c = target.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **_layer_config(target),
        "num_hidden_layers": 1,
        "draft_vocab_size": vd,
        "target_hidden_size": H,
        "tie_word_embeddings": False,
        "torch_dtype": str(state["fc.weight"].dtype).removeprefix("torch."),
        "bos_token_id": getattr(c, "bos_token_id", None),
        "eos_token_id": getattr(c, "eos_token_id", None),
        "pad_token_id": getattr(c, "pad_token_id", None),
        "eagle_config": eagle_config,
    }
    export = Export(
        layout=f"eagle3-{engine}",
        engine=engine,
        config=config,
        tensors=tensors,
        layer_ids={"canonical": canonical, "sglang": ids},
        serve=[
            f"python -m sglang.launch_server --model-path {target.path} --speculative-algorithm EAGLE3 "
            "--speculative-draft-model-path {dir} --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4"
        ],
        notes=[
            "eagle_aux_hidden_state_layer_ids are in SGLang's convention (canonical - 1): serve this directory "
            "with SGLang (or TensorRT-LLM); for vLLM export with --to vllm."
        ],
    )
    spec.config = {
        **_layer_spec_config(target),
        "num_hidden_layers": 1,
        "draft_vocab_size": vd,
        "eagle_config.eagle_aux_hidden_state_layer_ids": [c - 1 for c in canonical],
        "eagle_config.use_aux_hidden_state": True,
        "tie_word_embeddings": False,
    }
    return export, spec


def eagle3_speculators(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """EAGLE-3 -> vLLM's self-describing speculators format (`speculators_model_type: eagle3`)."""
    canonical, ids, vd, tensors, spec = _eagle3_common(source, target, "vllm", "layers.0.")
    without_identity_vocab_map(tensors, spec, target.vocab_size)
    kind = draft_layer_kind(source)
    # vLLM's default depth, at most the depths the head was trained on: the same in the speculators config
    # (what `vllm serve {dir}` reads) and in the explicit command
    depth = min(int(source["config"]["drafter"].get("ttt_steps", 3)), 3)
    speculative = vllm_speculative("eagle3", depth)
    export = Export(
        layout="eagle3-vllm-speculators",
        engine=engine,
        config=_speculators_config(source, target, vd, ids, depth),
        tensors=tensors,
        layer_ids={"canonical": canonical, "vllm": ids},
        serve=["vllm serve {dir}", vllm_serve(target.path, speculative)],
        speculative=speculative,
        notes=[
            'For T > 0 add "rejection_sample_method": "standard", "draft_sample_method": "probabilistic" to '
            "the speculative config (vLLM 0.32 takes greedy | probabilistic), or vLLM drafts greedily and "
            "accepts a draft with the target's probability only."
        ]
        + (
            [
                "The draft layer is speculators' qwen3 layer (transformer_layer_config.model_type qwen3): vLLM 0.32 "
                "builds it (speculators' algos.py maps qwen3 layers); SGLang does not serve it."
            ]
            if kind == "qwen3"
            else []
        ),
    )
    spec.config = _speculators_spec_config(target, vd, kind, canonical, draft_layer_count(source))
    return export, spec


def _speculators_config(
    source: dict[str, Any], target: TargetInfo, vd: int, ids: list[int], depth: int
) -> dict[str, Any]:
    """The speculators config.json: the EAGLE-3 head's settings, its draft layer's transformers config, and
    the verifier (the target) with the proposal method vLLM runs."""
    state, H = source["state"], target.hidden_size
    layer = draft_layer_config(target.config, target.vocab_size, layer=draft_layer_kind(source)).to_dict()
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype", "auto_map"):
        layer.pop(key, None)
    layer["num_hidden_layers"] = 1 + later_layers(state)  # vLLM builds the fused layer, then plain ones
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": vd,
        "target_hidden_size": H,
        "eagle_aux_hidden_state_layer_ids": ids,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_before_residual": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": str(state["fc.weight"].dtype).removeprefix("torch."),
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": depth,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {
                "name_or_path": source["target_name"],
                "architectures": list(getattr(target.config, "architectures", None) or []),
            },
        },
    }


def _speculators_spec_config(
    target: TargetInfo, vd: int, kind: str, canonical: list[int], num_layers: int
) -> dict[str, Any]:
    """The speculators config values vLLM reads, derived from the target and the drafter's settings."""
    layer_spec = {
        "transformer_layer_config." + k: v
        for k, v in _layer_config(target).items()
        if k not in ("rope_theta", "rope_scaling")
    }
    return {
        **layer_spec_config_rope(target),
        **layer_spec,
        "speculators_model_type": "eagle3",
        "transformer_layer_config.num_hidden_layers": num_layers,
        "draft_vocab_size": vd,
        "transformer_layer_config.model_type": kind,
        "eagle_aux_hidden_state_layer_ids": canonical,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_before_residual": False,
        "norm_output": False,
    }


def layer_spec_config_rope(target: TargetInfo) -> dict[str, Any]:
    """The rope settings a transformers-5 `transformer_layer_config` must carry (as `rope_parameters`)."""
    return {
        "transformer_layer_config.rope_parameters": draft_layer_settings(target.config)["rope_parameters"]
    }


def eagle1(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """EAGLE-1 -> the official SafeAILab layout (`LlamaForCausalLMEagle`) that SGLang loads, or vLLM's:
    `LlamaForCausalLM` (vLLM's EAGLEConfig prefixes `Eagle` to the architecture: 0.32 refuses
    `EagleLlamaForCausalLMEagle`) with a bias-free fc (vLLM's `EagleLlamaForCausalLM` has none)."""
    H = target.hidden_size
    needs_bias = engine != "vllm"  # SGLang's EAGLE fc = Linear(2H, H) always has a bias
    tensors = _eagle1_tensors(source, engine, H)
    config = {
        **{k: v for k, v in target.config.to_dict().items() if k not in ("transformers_version", "auto_map")},
        **_layer_config(target),
        "architectures": ["LlamaForCausalLM" if engine == "vllm" else "LlamaForCausalLMEagle"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "bias": needs_bias,
        "eagle_fc_bias": needs_bias,
        "tie_word_embeddings": False,
    }
    speculative = vllm_speculative("eagle", 5) if engine == "vllm" else None
    serve = (
        [vllm_serve(target.path, speculative)]
        if speculative is not None
        else [
            f"python -m sglang.launch_server --model-path {target.path} --speculative-algorithm EAGLE "
            "--speculative-draft-model-path {dir} --speculative-num-steps 5 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 6"
        ]
    )
    export = Export(
        layout=f"eagle1-{engine}",
        engine=engine,
        config=config,
        tensors=tensors,
        serve=serve,
        speculative=speculative,
        layer_ids={"canonical": [target.num_layers], engine: [target.num_layers]},
        notes=["EAGLE-1 reads the target's post-norm last hidden state and its LM head."],
    )
    shapes = layer_shapes(target, "layers.0.", H, input_norm=False)
    shapes["fc.weight"] = (H, 2 * H)
    if needs_bias:
        shapes["fc.bias"] = (H,)
    spec = LayoutSpec(
        tensors=shapes,
        config={
            **_layer_spec_config(target),
            "num_hidden_layers": 1,
            "bias": needs_bias,
            "eagle_fc_bias": needs_bias,
        },
        optional={"embed_tokens.weight": (target.vocab_size, H)},
    )
    return export, spec


def _eagle1_tensors(source: dict[str, Any], engine: str, H: int) -> dict[str, torch.Tensor]:
    """EAGLE-1's tensors under the official names, with the fc bias each engine's fc has: none in vLLM's (a
    trained non-zero one is refused), always one in the official layout's (zeros if trained without one)."""
    state, cfg = source["state"], source["config"]
    trained_bias = bool(cfg["drafter"].get("fc_bias", True))
    if trained_bias and "fc.bias" not in state:
        raise ExportError(
            "EAGLE-1 export: the checkpoint was trained with draft.fc_bias=true but has no fc.bias tensor; an "
            "engine would run fc with a zero or random bias (vllm#11126). Export refused: re-save the checkpoint."
        )
    tensors = _prefix_map(state, {"layer.": "layers.0."})
    if engine == "vllm":
        if trained_bias and bool(state["fc.bias"].any()):
            raise ExportError(
                "EAGLE-1 export to vLLM: vLLM's EAGLE-1 fc has no bias (vllm 0.32 llama_eagle.py), so this "
                "drafter's trained fc.bias would be dropped and its acceptance fall silently. Train with "
                "draft.fc_bias=false to serve it in vLLM, or export it with --to sglang."
            )
        tensors.pop("fc.bias", None)  # absent or all zeros: the same function without it
    elif "fc.bias" not in tensors:
        tensors["fc.bias"] = torch.zeros(H, dtype=state["fc.weight"].dtype)  # draft.fc_bias=false: bias 0
    return tensors
