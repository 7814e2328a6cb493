"""Where the training loop meets accelerate's engines (DDP, FSDP2, DeepSpeed ZeRO).

accelerate picks the engine from the launch config (`accelerate launch --config_file
recipes/accelerate/<engine>.yaml`); this module makes the rest of a run follow it:

* `make_accelerator` refuses an FSDP or DeepSpeed launch on a machine without a GPU. accelerate runs those
  engines only on accelerators; on CPU it silently falls back to plain DDP (FSDP) or starts every process
  as its own single-process run (DeepSpeed), and a user would believe the target was sharded.
* `shard_frozen_target` shards the frozen target like the drafter's engine: each decoder layer with FSDP2's
  `fully_shard` under FSDP, the whole model with a parameter-partitioning DeepSpeed engine under ZeRO-3
  (as TRL does for its frozen reference models). Under DDP and ZeRO-1/2 it stays replicated.
* `configure_deepspeed` copies the recipe's batch, accumulation and clipping settings into the DeepSpeed
  config, whose JSON leaves them "auto", so that `train.*` stays the one place they are set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

ShardKind = Literal["fsdp", "zero3"]


class EngineUnavailableError(ValueError):
    """The launch asked for an engine this machine cannot run."""


def requested_engine() -> str | None:
    """The sharding engine an `accelerate launch` config asked for ('fsdp' or 'deepspeed'), else None."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "deepspeed"
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "fsdp"
    return None


def make_accelerator(
    mixed_precision: str, grad_accum: int, log_with: str | None, output_dir: Path, compile: bool = False
) -> Accelerator:
    """The run's Accelerator (with `compile`, accelerate's TorchDynamo backend: `prepare` compiles the model).

    Without a GPU it is told `cpu=True`: that is what makes accelerate join a torchrun / `accelerate launch`
    process group over gloo instead of running every rank as rank 0. `grad_accum` is given to accelerate
    so that DeepSpeed, which steps inside `backward`, steps once per accumulation window.

    Raises:
        EngineUnavailableError: an FSDP or DeepSpeed launch without a GPU.
    """
    engine = requested_engine()
    if not torch.cuda.is_available():
        if engine is not None:
            raise EngineUnavailableError(
                f"this run was launched with a {engine.upper()} accelerate config, but this machine has no GPU: "
                f"accelerate runs {engine.upper()} only on GPUs (on CPU it would silently run without sharding). "
                "Launch with recipes/accelerate/ddp.yaml (or single.yaml) here, or run on GPUs."
            )
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else DeepSpeed warns on stdout when it probes
    return Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=grad_accum,
        log_with=log_with,
        project_dir=str(output_dir),
        dynamo_backend="inductor" if compile else None,
    )


def shard_kind(accelerator: Accelerator) -> ShardKind | None:
    """How the frozen target is sharded under this accelerator's engine (None: replicated)."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return "fsdp"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        plugin = accelerator.state.deepspeed_plugin
        if plugin is not None and int(plugin.zero_stage) == 3:
            return "zero3"
    return None


def configure_deepspeed(
    accelerator: Accelerator, micro_batch_size: int, grad_accum: int, max_grad_norm: float | None
) -> None:
    """Fill the DeepSpeed config's batch, accumulation and clipping entries from the recipe (no-op otherwise)."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = micro_batch_size
    ds["gradient_accumulation_steps"] = grad_accum
    ds["train_batch_size"] = micro_batch_size * grad_accum * accelerator.num_processes
    ds["gradient_clipping"] = float(max_grad_norm) if max_grad_norm else 0.0


def shard_frozen_target(model: Any, kind: ShardKind, device_type: str) -> Any:
    """Shard the frozen target `model` (a transformers causal LM) across the process group, in place.

    fsdp: every decoder layer becomes its own FSDP2 unit, gathered for its forward and freed after. The
        embedding, final norm and LM head stay whole on every rank: drafters call them directly (EAGLE's
        and MTP's shared embedding and head) and a separate unit for a tied embedding/head pair would
        split one parameter across two groups. For Llama-3-8B that leaves its 2.1 GB embedding and head (bf16)
        replicated out of 16 GB.
    zero3: a DeepSpeed engine without an optimizer partitions every parameter and gathers each module's
        parameters in its forward pre-hook, including the embedding and head when a drafter calls them.

    Returns the module to call (the same `model`; its parameters are now shards).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("shard_frozen_target needs an initialised process group")
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device_type, (dist.get_world_size(),))
        for layer in model.get_decoder().layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        return model
    if kind == "zero3":
        import deepspeed

        dtype = next(model.parameters()).dtype
        hidden = int(model.config.get_text_config().hidden_size)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "bf16": {"enabled": dtype == torch.bfloat16},
            "fp16": {"enabled": dtype == torch.float16},
            "zero_optimization": {
                "stage": 3,
                # No prefetching: drafters call the embedding and head outside the target's own forward,
                # which a recorded prefetch order would not expect.
                "stage3_prefetch_bucket_size": 0,
                "stage3_param_persistence_threshold": 10 * hidden,
            },
        }
        engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()
        return model
    raise ValueError(f"unknown shard kind {kind!r}; expected 'fsdp' or 'zero3'")


def local_parameter_count(model: Any) -> int:
    """Parameters this rank holds of `model` (its shards under FSDP / ZeRO-3, everything when replicated)."""
    total = 0
    for p in model.parameters():
        if hasattr(p, "ds_tensor"):  # a ZeRO-3 partitioned parameter
            total += p.ds_tensor.numel()
        elif hasattr(p, "to_local"):  # an FSDP2 DTensor shard
            total += p.to_local().numel()
        else:
            total += p.numel()
    return total
