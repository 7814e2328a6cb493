"""DFlash in the layouts engines load (docs/ALGORITHMS-BLOCK.md 1.5, docs/ENGINES.md 6.8).

draftsmith's tensor names are z-lab's: `layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.self_attn.{q,k}_norm`,
`layers.{i}.mlp.{gate,up,down}_proj`, `layers.{i}.{input,post_attention}_layernorm`, `fc` [H, |T| H],
`hidden_norm`, `norm`. Both layouts carry them unchanged:

    z-lab / SGLang (`--to sglang`, `--to hf`)   `DFlashDraftModel`, model_type qwen3, `dflash_config` with
                                                `target_layer_ids` = canonical - 1 (z-lab ids name layer
                                                OUTPUTS) and `mask_token_id`; no embedding, no LM head (SGLang
                                                uses the target's)
    speculators / vLLM (`--to vllm`)            `DFlashSpeculator`, `aux_hidden_state_layer_ids` = canonical,
                                                `transformer_layer_config` (qwen3), plus the target's embedding
                                                and LM head (bit-identical); no vocabulary map (draftsmith
                                                drafts the full vocabulary, and vLLM refuses a d2t then)

Layer ids: the same canonical taps, written in each engine's convention (`to_engine_ids`).
"""

from __future__ import annotations

from typing import Any

from draftsmith.models.draft_layer import draft_layer_config, draft_layer_settings

from .common import Export, LayoutSpec, to_engine_ids, vllm_serve, vllm_speculative
from .eagle import layer_shapes
from .target_info import TargetInfo, rope_settings


def _drafter(source: dict[str, Any]) -> tuple[list[int], int, int, int]:
    """`(canonical taps, block size B, draft layers N, mask token id)` from a checkpoint."""
    cfg = source["config"]
    d = cfg["drafter"]
    return (
        [int(i) for i in cfg["feature_layers"]],
        int(d["block_size"]),
        int(d["num_layers"]),
        int(d["mask_token_id"]),
    )


def _spec(target: TargetInfo, taps: int, layers: int) -> LayoutSpec:
    """The tensors both layouts carry: N Qwen3 layers with an input norm and q/k norms, fc, hidden_norm, norm."""
    H = target.hidden_size
    tensors: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, taps * H),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
    }
    for i in range(layers):
        tensors.update(layer_shapes(target, f"layers.{i}.", H, input_norm=True, layer="qwen3"))
    return LayoutSpec(tensors=tensors)


def _qwen3_layer_config(target: TargetInfo, layers: int) -> dict[str, Any]:
    """The draft layers' Qwen3 config, with the target's dimensions and rope (legacy keys engines read)."""
    config = draft_layer_config(target.config, target.vocab_size, layer="qwen3").to_dict()
    for key in (
        "architectures",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "auto_map",
        "rope_parameters",
    ):
        config.pop(key, None)
    rope = rope_settings({"rope_parameters": draft_layer_settings(target.config)["rope_parameters"]})
    return {
        **config,
        **rope,
        "num_hidden_layers": layers,
        "layer_types": ["full_attention"] * layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": layers,
    }


def dflash_sglang(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """DFlash -> z-lab's layout, which SGLang (`--speculative-algorithm DFLASH`) and z-lab's reference load."""
    canonical, B, N, mask = _drafter(source)
    ids = to_engine_ids(canonical, "sglang", target.num_layers)
    state = source["state"]
    config = {
        **_qwen3_layer_config(target, N),
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": B,
        "num_target_layers": target.num_layers,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": ids, "block_size": B},
        "tie_word_embeddings": False,
        "torch_dtype": str(state["fc.weight"].dtype).removeprefix("torch."),
    }
    export = Export(
        layout=f"dflash-{engine}",
        engine=engine,
        config=config,
        tensors=dict(state),
        layer_ids={"canonical": canonical, "sglang": ids},
        serve=[
            f"python -m sglang.launch_server --model-path {target.path} --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path {{dir}} --speculative-num-draft-tokens {B}"
        ],
        notes=[
            "dflash_config.target_layer_ids name layer OUTPUTS (canonical - 1), z-lab's convention; for vLLM "
            "export with --to vllm.",
            "The block attends bidirectionally, with no sliding window: every layer is full_attention.",
            "No auto_map: z-lab's `DFlashDraftModel` code is not shipped; SGLang builds the model itself.",
        ],
    )
    spec = _spec(target, len(canonical), N)
    layer = {k: v for k, v in _qwen3_layer_config(target, N).items() if k not in ("layer_types",)}
    spec.config = {
        **layer,
        "dflash_config.target_layer_ids": [c - 1 for c in canonical],
        "dflash_config.mask_token_id": mask,
        "block_size": B,
        "num_target_layers": target.num_layers,
        "tie_word_embeddings": False,
    }
    return export, spec


def dflash_speculators(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """DFlash -> vLLM's speculators format (`speculators_model_type: dflash`, `"method": "dflash"`)."""
    canonical, B, N, mask = _drafter(source)
    ids = to_engine_ids(canonical, "vllm", target.num_layers)
    state, H, V = source["state"], target.hidden_size, target.vocab_size
    layer = _qwen3_layer_config(target, N)
    tensors = {
        **state,
        "embed_tokens.weight": target.embedding(),
        "lm_head.weight": target.lm_head(),
    }
    config = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": V,
        "block_size": B,
        "target_hidden_size": H,
        "aux_hidden_state_layer_ids": ids,
        "mask_token_id": mask,
        "sliding_window_non_causal": True,  # the block attends both ways; false makes vLLM run it causally
        "sample_from_anchor": False,
        "tie_word_embeddings": False,
        "dtype": str(state["fc.weight"].dtype).removeprefix("torch."),
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": B - 1}],
            "verifier": {
                "name_or_path": source["target_name"],
                "architectures": list(getattr(target.config, "architectures", None) or []),
            },
        },
    }
    speculative = vllm_speculative("dflash", B - 1)
    export = Export(
        layout="dflash-vllm-speculators",
        engine=engine,
        config=config,
        tensors=tensors,
        layer_ids={"canonical": canonical, "vllm": ids},
        serve=[vllm_serve(target.path, speculative)],
        speculative=speculative,
        served_depths=(B - 1, B - 1),  # vLLM's block size is num_speculative_tokens + 1: the trained block
        notes=[
            "aux_hidden_state_layer_ids are canonical ids (the stream entering layer i); vLLM maps them to "
            "z-lab's target_layer_ids as id - 1 (vllm#40727). Pin the vLLM version and check acceptance once.",
            "sample_from_anchor is false: slot 0 is the bonus token and B-1 tokens are drafted per pass.",
        ],
    )
    spec = _spec(target, len(canonical), N)
    spec.tensors.update({"embed_tokens.weight": (V, H), "lm_head.weight": (V, H)})
    spec.shared = {"embed_tokens.weight": "embedding", "lm_head.weight": "lm_head"}
    spec.config = {
        **{f"transformer_layer_config.{k}": v for k, v in layer.items() if k != "layer_types"},
        "speculators_model_type": "dflash",
        "aux_hidden_state_layer_ids": canonical,
        "mask_token_id": mask,
        "block_size": B,
        "sample_from_anchor": False,
        "speculators_config.proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": B - 1}],
    }
    return export, spec
