"""Run under torchrun (2 processes, gloo): shard a saved target as FSDP2 / ZeRO-3 would in training and
compare its features, logits and the embedding / head calls drafters make with the unsharded target.

    torchrun --nproc_per_node 2 tests/recipes/_shard_target.py fsdp|zero3 TARGET_DIR OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from typing import Literal

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from draftsmith.models.target import FrozenTarget, LayerId, TargetConfig  # noqa: E402
from draftsmith.train.core.distributed import local_parameter_count, shard_frozen_target  # noqa: E402


def main() -> None:
    kind, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "zero3":
        import deepspeed

        deepspeed.init_distributed("gloo")
    else:
        dist.init_process_group("gloo")
    target = FrozenTarget.load(TargetConfig(path=path, dtype="float32"))
    torch.manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    layers: tuple[LayerId, ...] = (1, target.num_layers, "final")
    ref, ref_logits = target.forward(ids, mask, layer_ids=layers, return_logits=True)
    ref_embed = target.embed_tokens(ids)
    x = ref["final"].detach().clone().requires_grad_(True)  # gradients flow through the frozen head
    (target.lm_head(x) ** 2).sum().backward()  # into a drafter's predicted features (EAGLE-1, MTP)
    ref_grad = x.grad
    full = local_parameter_count(target.model)
    sharding: Literal["fsdp", "zero3"] = "zero3" if kind == "zero3" else "fsdp"
    shard_frozen_target(target.model, sharding, "cpu")
    target.sharded = True  # as train/core/entry.py marks it
    feats, logits = target.forward(ids, mask, layer_ids=layers, return_logits=True)
    embed = target.embed_tokens(ids)  # what EAGLE / MTP drafters call directly
    head = target.lm_head(ref["final"])
    y = ref["final"].detach().clone().requires_grad_(True)
    (target.lm_head(y) ** 2).sum().backward()
    diffs = {str(k): float((feats[k] - ref[k]).abs().max()) for k in layers}
    assert logits is not None and ref_logits is not None and y.grad is not None and ref_grad is not None
    diffs["logits"] = float((logits - ref_logits).abs().max())
    diffs["embed"] = float((embed - ref_embed).abs().max())
    diffs["head"] = float((head - ref_logits).abs().max())
    diffs["head_grad"] = float((y.grad - ref_grad).abs().max())
    local = local_parameter_count(target.model)
    alone, _ = target.forward(ids, mask, layer_ids=(1,))  # features alone: every layer still runs its hooks
    diffs["features_alone"] = float((alone[1] - ref[1]).abs().max())
    result = {"full": full, "local": local, "diffs": diffs}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()


if __name__ == "__main__":
    main()
