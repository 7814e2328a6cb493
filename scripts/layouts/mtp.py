"""MTP modules in DeepSeek-V3's nextn layout (ENGINES.md 6.5; the mapping is models/mtp.py's docstring).

Module k (1-based) of an L-layer target is the extra decoder layer `model.layers.{L + k - 1}` with enorm,
hnorm, eh_proj, the block, `shared_head.norm`, and copies of the target's LM head (`shared_head.head`) and
embedding (`embed_tokens`), which must be bit-identical to the target's. config.json is the target's with
`num_nextn_predict_layers: D`. The weights file holds only the MTP layers: stitch them into the target's
checkpoint with the engine's tooling (speculators `stitch_mtp.py`, ModelOpt `export_native_mtp.py`) for a
target family that serves native MTP (DeepSeek-V3 / R1: SGLang `--speculative-algorithm NEXTN`, vLLM
`method: deepseek_mtp`).
"""

from __future__ import annotations

from typing import Any

from draftsmith.models.mtp import nextn_tensors

from .common import Export, LayoutSpec, TargetInfo
from .eagle import layer_shapes


def mtp_nextn(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    L, H, V = target.num_layers, target.hidden_size, target.vocab_size
    D = int(source["config"]["drafter"]["num_modules"])
    tensors = nextn_tensors(source["state"], L, target.embedding(), target.lm_head())
    config = {
        k: v for k, v in target.config.to_dict().items() if k not in ("transformers_version", "auto_map")
    }
    config["num_nextn_predict_layers"] = D
    export = Export(
        layout="mtp-deepseek-nextn", engine=engine, config=config, tensors=tensors,
        layer_ids={"canonical": [L], "nextn_layers": list(range(L, L + D))},
        serve=["python -m sglang.launch_server --model-path {stitched} --speculative-algorithm NEXTN "
               f"--speculative-num-steps {D} --speculative-eagle-topk 1 --speculative-num-draft-tokens {D + 1}",
               "vllm serve {stitched} --speculative-config "
               f"'{{\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": {D}}}'"],
        notes=["The weights are the MTP layers only; {stitched} is the target checkpoint with them added as "
               f"model.layers.{L}..{L + D - 1} and num_nextn_predict_layers set. Engines serve native MTP for "
               "targets of the DeepSeek-V3 family (and Qwen3-Next / Qwen3.5 under mtp.*)."],
    )  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {}
    shared: dict[str, str] = {}
    for k in range(D):
        p = f"model.layers.{L + k}."
        shapes.update(layer_shapes(target, p, H, input_norm=True))
        shapes.update({p + "enorm.weight": (H,), p + "hnorm.weight": (H,), p + "eh_proj.weight": (H, 2 * H),
                       p + "shared_head.norm.weight": (H,), p + "shared_head.head.weight": (V, H),
                       p + "embed_tokens.weight": (V, H)})  # fmt: skip
        shared.update({p + "shared_head.head.weight": "lm_head", p + "embed_tokens.weight": "embedding"})
    rope = target.config.to_dict()
    spec = LayoutSpec(
        tensors=shapes, shared=shared,
        config={"num_nextn_predict_layers": D, "num_hidden_layers": L, "hidden_size": H, "vocab_size": V,
                "max_position_embeddings": target.max_positions(),
                **({"rope_parameters": rope["rope_parameters"]} if "rope_parameters" in rope
                   else {"rope_theta": target.rope()["rope_theta"]})},
    )  # fmt: skip
    return export, spec
