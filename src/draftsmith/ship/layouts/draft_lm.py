"""A distilled draft LM as the plain transformers directory that vLLM (`method: draft_model`) and SGLang
(`--speculative-algorithm STANDALONE`) load: config.json, the weights, and the target's tokenizer.

Engines pair a draft LM with the target by token id, so the export refuses a draft whose output layer or
tokenizer differs from the target's; every tensor the model class declares must be present (tied LM heads
excepted), with its shape.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from draftsmith.models.identity import tokenizer_fingerprint

from .common import Export, ExportError, LayoutSpec, vllm_serve, vllm_speculative
from .target_info import TargetInfo

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
)


def draft_lm_hf(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src: Path = source["dir"]
    draft_tok = AutoTokenizer.from_pretrained(str(src))
    target_tok = AutoTokenizer.from_pretrained(target.path, revision=target.revision)
    if tokenizer_fingerprint(draft_tok) != tokenizer_fingerprint(target_tok):
        raise ExportError(
            f"draft LM export: {src} has a different tokenizer from the target {target.path}; engines pair draft "
            "and target tokens by id, so every proposal would be wrong. Export refused."
        )
    config = json.loads((src / "config.json").read_text())
    hf_config = AutoConfig.from_pretrained(str(src))
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    # The names and shapes save_pretrained writes (and engines load): transformers fuses MoE experts in memory
    # (`experts.gate_up_proj [E, 2I, H]`) and splits them again on disk (`experts.{e}.gate_proj.weight`).
    on_disk = revert_weight_conversion(model, model.state_dict())
    shapes = {k: tuple(v.shape) for k, v in dict(on_disk).items()}
    tied = getattr(hf_config, "tie_word_embeddings", False)
    optional = {}
    if tied:  # save_pretrained writes one copy of a tied LM head
        out_name = next(k for k in shapes if k.endswith("lm_head.weight"))
        optional[out_name] = shapes.pop(out_name)

    def copy_tokenizer(tmp: Path) -> None:
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)

    speculative = vllm_speculative("draft_model", 4) if engine == "vllm" else None
    serve = (
        [vllm_serve(target.path, speculative)]
        if speculative is not None
        else [
            "python -m sglang.launch_server --model-path "
            + target.path
            + " --speculative-algorithm STANDALONE "
            "--speculative-draft-model-path {dir} --speculative-num-steps 4 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 5"
        ]
    )
    export = Export(
        layout="draft-lm-hf",
        engine=engine,
        config=config,
        tensors=source["state"],
        serve=serve,
        speculative=speculative,
        extra={"tokenizer": copy_tokenizer},
    )
    spec = LayoutSpec(
        tensors=shapes,
        optional=optional,
        own_embedding=True,
        config={"vocab_size": target.vocab_size, "model_type": hf_config.model_type},
    )
    return export, spec


def read_draft_lm_state(src: Path) -> dict[str, torch.Tensor]:
    """The draft LM's tensors as saved (one safetensors file or an index of shards)."""
    from safetensors.torch import load_file

    files = sorted(src.glob("model*.safetensors"))
    if not files:
        raise ExportError(f"{src} has no model*.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
