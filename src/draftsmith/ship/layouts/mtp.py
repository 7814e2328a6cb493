"""MTP modules in the native layouts engines load (ENGINES.md 6.5; the mapping is models/mtp.py's docstring).

Engines serve MTP only as the target family's own MTP layers (models/serving.py), so the layout follows the
target:

- DeepSeek-V3 (`nextn`): module k (1-based) of an L-layer target is the extra decoder layer
  `model.layers.{L + k - 1}` with enorm, hnorm, eh_proj, the block (DeepSeek's own MLA + MoE layer),
  `shared_head.norm`, and copies of the target's LM head (`shared_head.head`) and embedding (`embed_tokens`),
  bit-identical to the target's. config.json is the target's with `num_nextn_predict_layers: D`.
- Qwen3-Next / Qwen3.5 (`mtp.*`): ONE module applied at every draft step: `mtp.fc` (eh_proj),
  `mtp.pre_fc_norm_embedding` (enorm), `mtp.pre_fc_norm_hidden` (hnorm), `mtp.layers.0.*` (the family's own
  full-attention layer), `mtp.norm` (the module's final norm); the embedding and head are the target's.
  config.json is the target's with `mtp_num_hidden_layers: 1`.

The weights file holds only the MTP layers: stitch them into the target's checkpoint with the engine's
tooling (speculators `stitch_mtp.py`, ModelOpt `export_native_mtp.py`). Any other target: refused, with
the line that says which engines serve what.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.models.mtp import NATIVE_MTP, nextn_tensors
from draftsmith.models.serving import unserved_reason

from .common import Export, ExportError, LayoutSpec, vllm_serve, vllm_speculative
from .target_info import TargetInfo


def on_disk(target: TargetInfo, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` under the names and shapes the family's checkpoints use on disk, which engines load:
    transformers fuses MoE experts in memory (`experts.gate_up_proj [E, 2I, H]`) and splits them again when it
    saves (`experts.{e}.gate_proj.weight`); its own reverse conversion does the same here."""
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(target._load(), dict(tensors)))


def native_layer_shapes(target: TargetInfo, prefix: str) -> dict[str, tuple[int, ...]]:
    """The on-disk shapes of the target's own last full-attention decoder layer, under `prefix`: what an
    engine's native MTP layer of this family holds (DeepSeek-V3's last layer is an MoE layer, as its MTP
    layer is)."""
    from draftsmith.models.target import find_decoder

    layers = find_decoder(target._load()).layers
    types = getattr(target.config, "layer_types", None) or ["full_attention"] * len(layers)
    index = max(i for i, t in enumerate(types) if t == "full_attention")
    state = {prefix + n: t for n, t in layers[index].state_dict().items() if "rotary_emb." not in n}
    return {n: tuple(t.shape) for n, t in on_disk(target, state).items()}


def _target_config(target: TargetInfo) -> dict[str, Any]:
    return {k: v for k, v in target.config.to_dict().items() if k not in ("transformers_version", "auto_map")}


def _rope_spec(target: TargetInfo) -> dict[str, Any]:
    rope = target.config.to_dict()
    if "rope_parameters" in rope:
        return {"rope_parameters": rope["rope_parameters"]}
    return {"rope_theta": target.rope()["rope_theta"]}


def mtp_native(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """MTP modules -> the target family's native layout (nextn or mtp.*); refused for other targets."""
    layout = NATIVE_MTP.get(target.model_type())
    if layout is None:
        raise ExportError(f"MTP export: {unserved_reason('mtp', target.config)}")
    if layout == "nextn":
        return _nextn(source, target, engine)
    return _qwen_mtp(source, target, engine)


def _nextn(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    L, H, V = target.num_layers, target.hidden_size, target.vocab_size
    D = int(source["config"]["drafter"]["num_modules"])
    tensors = on_disk(target, nextn_tensors(source["state"], L, target.embedding(), target.lm_head()))
    config = _target_config(target)
    config["num_nextn_predict_layers"] = D
    native = vllm_speculative("deepseek_mtp", D, model=False)  # the target carries the MTP layers
    export = Export(
        layout="mtp-deepseek-nextn",
        engine=engine,
        config=config,
        tensors=tensors,
        layer_ids={"canonical": [L], "nextn_layers": list(range(L, L + D))},
        serve=[
            "python -m sglang.launch_server --model-path {stitched} --speculative-algorithm NEXTN "
            f"--speculative-num-steps {D} --speculative-eagle-topk 1 --speculative-num-draft-tokens {D + 1}",
            vllm_serve("{stitched}", native),
        ],
        speculative=native if engine == "vllm" else None,
        notes=[
            "The weights are the MTP layers only; {stitched} is the target checkpoint with them added as "
            f"model.layers.{L}..{L + D - 1} and num_nextn_predict_layers set."
        ],
    )
    shapes: dict[str, tuple[int, ...]] = {}
    shared: dict[str, str] = {}
    for k in range(D):
        p = f"model.layers.{L + k}."
        shapes.update(native_layer_shapes(target, p))
        shapes.update(
            {
                p + "enorm.weight": (H,),
                p + "hnorm.weight": (H,),
                p + "eh_proj.weight": (H, 2 * H),
                p + "shared_head.norm.weight": (H,),
                p + "shared_head.head.weight": (V, H),
                p + "embed_tokens.weight": (V, H),
            }
        )
        shared.update({p + "shared_head.head.weight": "lm_head", p + "embed_tokens.weight": "embedding"})
    spec = LayoutSpec(
        tensors=shapes,
        shared=shared,
        config={
            "num_nextn_predict_layers": D,
            "num_hidden_layers": L,
            "hidden_size": H,
            "vocab_size": V,
            "max_position_embeddings": target.max_positions(),
            **_rope_spec(target),
        },
    )
    return export, spec


_QWEN_NAMES = {
    "eh_proj.": "mtp.fc.",
    "enorm.": "mtp.pre_fc_norm_embedding.",
    "hnorm.": "mtp.pre_fc_norm_hidden.",
    "shared_head_norm.": "mtp.norm.",
    "block.": "mtp.layers.0.",
}


def _qwen_mtp(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    H = target.hidden_size
    D = int(source["config"]["drafter"]["num_modules"])
    if D != 1:
        raise ExportError(
            f"MTP export: {target.model_type()} engines apply ONE MTP module at every draft step; this checkpoint "
            f"has {D} (train with draft.num_modules=1)"
        )
    tensors = {}
    for name, tensor in source["state"].items():
        rest = name.removeprefix("layers.0.")
        if rest.startswith("rotary_emb."):
            continue
        old = next(o for o in _QWEN_NAMES if rest.startswith(o))
        tensors[_QWEN_NAMES[old] + rest[len(old) :]] = tensor.detach().clone()
    tensors = on_disk(target, tensors)
    config = _target_config(target)
    config["mtp_num_hidden_layers"] = 1
    native = vllm_speculative("mtp", 3, model=False)
    export = Export(
        layout="mtp-qwen3",
        engine=engine,
        config=config,
        tensors=tensors,
        layer_ids={"canonical": [target.num_layers]},
        serve=[
            vllm_serve("{stitched}", native),
            "python -m sglang.launch_server --model-path {stitched} --speculative-algorithm NEXTN "
            "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
        ],
        notes=[
            "The weights are the mtp.* tensors only; {stitched} is the target checkpoint with them added and "
            "mtp_num_hidden_layers: 1. The embedding and LM head are the target's."
        ],
        speculative=native if engine == "vllm" else None,
    )
    shapes = native_layer_shapes(target, "mtp.layers.0.")
    shapes.update(
        {
            "mtp.fc.weight": (H, 2 * H),
            "mtp.pre_fc_norm_embedding.weight": (H,),
            "mtp.pre_fc_norm_hidden.weight": (H,),
            "mtp.norm.weight": (H,),
        }
    )
    spec = LayoutSpec(
        tensors=shapes,
        config={
            "mtp_num_hidden_layers": 1,
            "num_hidden_layers": target.num_layers,
            "hidden_size": H,
            "vocab_size": target.vocab_size,
            "max_position_embeddings": target.max_positions(),
            **_rope_spec(target),
        },
    )
    return export, spec
