"""Medusa heads in vLLM's layout and in the FasterDecoding / TGI layout (ENGINES.md 6.4).

    draftsmith                          vLLM (`--to vllm`)                 FasterDecoding / TGI (`--to tgi`, `hf`)
    heads.{i}.{j}.linear.weight/bias    blocks.{i}.layers.{j}.weight/bias  {i}.{j}.linear.weight/bias
    heads.{i}.{n}.weight [V, H]         lm_heads.{i}.weight                {i}.{n}.weight     (n = num_layers)
    config                              model_type medusa, num_heads,      medusa_num_heads, medusa_num_layers,
                                        num_hidden_layers, medusa_fc_bias  base_model_name_or_path
                                        (vLLM drops the ResBlock biases
                                        without it; unknown names are
                                        skipped silently)
    file                                model.safetensors                  medusa_lm_head.safetensors

A Medusa-2 checkpoint also carries a LoRA adapter: its heads read the ADAPTED target, so the export writes the
target with the adapter merged under `target/`, and that is the model to serve.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from .common import Export, ExportError, LayoutSpec, vllm_serve, vllm_speculative
from .target_info import TargetInfo

_HEAD = re.compile(r"heads\.(\d+)\.(\d+)\.(.+)")


def _head_shapes(K: int, n: int, H: int, V: int, block: str, lm: str) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(K):
        for j in range(n):
            shapes[block.format(i=i, j=j) + "weight"] = (H, H)
            shapes[block.format(i=i, j=j) + "bias"] = (H,)
        shapes[lm.format(i=i, n=n)] = (V, H)
    return shapes


def _renamed(state: dict[str, torch.Tensor], n: int, block: str, lm: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        m = _HEAD.fullmatch(name)
        if m is None:
            raise ExportError(f"Medusa export: unexpected tensor {name!r} in the checkpoint")
        i, j, rest = int(m[1]), int(m[2]), m[3]
        if j < n:
            out[block.format(i=i, j=j) + rest.removeprefix("linear.")] = tensor
        else:
            out[lm.format(i=i, n=n)] = tensor
    return out


def _sizes(source: dict[str, Any], target: TargetInfo) -> tuple[int, int, int, int]:
    d = source["config"]["drafter"]
    return int(d["num_heads"]), int(d["num_layers"]), target.hidden_size, target.vocab_size


def medusa_vllm(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    K, n, H, V = _sizes(source, target)
    block, lm = "blocks.{i}.layers.{j}.", "lm_heads.{i}.weight"
    speculative = vllm_speculative("medusa", K)
    export = Export(
        layout="medusa-vllm",
        engine=engine,
        tensors=_renamed(source["state"], n, block, lm),
        config={
            "model_type": "medusa",
            "architectures": ["MedusaModel"],
            "hidden_size": H,
            "vocab_size": V,
            "num_heads": K,
            "num_hidden_layers": n,
            "medusa_fc_bias": True,
            "truncated_vocab_size": V,
        },
        serve=[vllm_serve(target.path, speculative)],
        speculative=speculative,
        served_depths=(1, K),  # vLLM sets num_heads to num_speculative_tokens (ENGINES.md 5.1)
        notes=["vLLM proposes a top-1 chain from Medusa heads (no tree)."],
    )
    spec = LayoutSpec(
        tensors=_head_shapes(K, n, H, V, block, lm),
        config={
            "model_type": "medusa",
            "num_heads": K,
            "num_hidden_layers": n,
            "hidden_size": H,
            "vocab_size": V,
            "medusa_fc_bias": True,
        },
    )
    return _with_adapter(export, source, target), spec


def medusa_tgi(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    from draftsmith.models.medusa2 import adapter_dir

    K, n, H, V = _sizes(source, target)
    block, lm = "{i}.{j}.linear.", "{i}.{n}.weight"
    # Medusa-2: the base model is the merged target written next to the heads (see _with_adapter).
    base = "target" if adapter_dir(str(source["dir"])) is not None else source["target_name"]
    export = Export(
        layout="medusa-fasterdecoding",
        engine=engine,
        tensors=_renamed(source["state"], n, block, lm),
        weights_file="medusa_lm_head.safetensors",
        config={
            "medusa_num_heads": K,
            "medusa_num_layers": n,
            "base_model_name_or_path": base,
            "hidden_size": H,
            "vocab_size": V,
        },
        serve=["text-generation-launcher --model-id {dir} --speculate " + str(K)],
        notes=["TGI reads base_model_name_or_path from config.json and serves that target with these heads."],
    )
    spec = LayoutSpec(
        tensors=_head_shapes(K, n, H, V, block, lm),
        config={"medusa_num_heads": K, "medusa_num_layers": n, "base_model_name_or_path": base},
    )
    return _with_adapter(export, source, target), spec


def _with_adapter(export: Export, source: dict[str, Any], target: TargetInfo) -> Export:
    """Medusa-2: add the target with the LoRA adapter merged (`target/`), the model the heads were trained on."""
    from draftsmith.models.medusa2 import adapter_dir

    adapter = adapter_dir(str(source["dir"]))
    served = "the target" if adapter is None else "{dir}/target"
    export.serve = [
        s.replace("{target}", target.path if adapter is None else "{dir}/target") for s in export.serve
    ]
    if adapter is None:
        return export

    def write_merged(tmp: Path) -> None:
        from draftsmith.models.medusa2 import adapted_target
        from draftsmith.models.target import FrozenTarget, TargetConfig

        base = FrozenTarget.load(TargetConfig(path=target.path, revision=target.revision))
        merged = adapted_target(base, adapter)
        merged.model.save_pretrained(tmp / "target")
        merged.tokenizer.save_pretrained(tmp / "target")

    export.extra["target"] = write_merged
    if "base_model_name_or_path" in export.config:
        export.notes.append(
            "base_model_name_or_path is `target` (this directory's merged model): TGI resolves it from its working "
            "directory, so launch it from here or set the absolute path."
        )
    export.notes.append(
        f"Medusa-2: the heads read the adapted target; serve {served} (written with the LoRA adapter merged), "
        "not the original target."
    )
    return export
