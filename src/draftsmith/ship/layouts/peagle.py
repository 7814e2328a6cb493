"""P-EAGLE in vLLM's speculators layout (`speculators_model_type: peagle`; docs/ALGORITHMS-BLOCK.md section 2.4).

EAGLE-3's speculators layout (docs/ENGINES.md 6.2) with N layers, the mask hidden state and an embedding:

    draftsmith name                               speculators name                                 shape
    fc, layer.*, norm_in, norm_hidden,            as EAGLE-3 under layers.0. (q/k/v read 2H)
      norm_final, lm_head_d, d2t, t2d
    later.{k}.* (standard Llama layers)           layers.{k+1}.* incl. input_layernorm (q/k/v read H)
    mask_hidden [3H]                              mask_hidden                                      [1, 1, 3H]
    mask_embedding [H] + the target's embedding   embed_tokens.weight: the target's rows, row          [V, H]
                                                  mask_token_id replaced by the mask embedding

vLLM reads `mask_token_id` (its parallel-drafting token) and embeds it with the draft's own `embed_tokens`,
and runs `fc(mask_hidden)` at every mask slot; every other row is copied from the loaded target, so real
tokens embed as with the target's table. Layer ids in vLLM's convention (canonical; docs/ENGINES.md 6.3). vLLM 0.32 turns
parallel drafting on by itself only when the export directory is served as the model (`vllm serve DIR`); with an
explicit speculative config beside a target it must say `"parallel_drafting": true`, so the serve command and
`speculative_config` set it.
SGLang does not serve P-EAGLE (refused in the family record).
"""

from __future__ import annotations

import json
from typing import Any

from .common import Export, ExportError, LayoutSpec, vllm_serve, vllm_speculative
from .eagle import eagle3_speculators
from .target_info import TargetInfo


def peagle_speculators(source: dict[str, Any], target: TargetInfo, engine: str) -> tuple[Export, LayoutSpec]:
    """P-EAGLE -> the speculators P-EAGLE layout vLLM loads with `parallel_drafting`."""
    cfg = source["config"]["drafter"]
    D, mask_id = int(cfg["num_depths"]), int(cfg["mask_token_id"])
    H, V = target.hidden_size, target.vocab_size
    state = dict(source["state"])
    mask_hidden, mask_embedding = state.pop("mask_hidden"), state.pop("mask_embedding")
    base, spec = eagle3_speculators({**source, "state": state}, target, "vllm")  # maps layers 1..N-1 too
    embedding = target.embedding().clone()
    if tuple(embedding.shape) != (V, H) or not 0 <= mask_id < V:
        raise ExportError(
            f"P-EAGLE export: mask_token_id {mask_id} is not a row of the target's [{V}, {H}] embedding"
        )
    embedding[mask_id] = mask_embedding.to(embedding.dtype)
    tensors = {
        **base.tensors,
        "mask_hidden": mask_hidden.reshape(1, 1, 3 * H),
        "embed_tokens.weight": embedding,
    }
    config = json.loads(json.dumps(base.config))  # a deep copy of EAGLE-3's
    config.update(
        architectures=["PEagleSpeculator"],
        speculators_model_type="peagle",
        mask_token_id=mask_id,
        embed_requires_grad=cfg["mask_embedding"] == "learned",
    )
    config["speculators_config"]["algorithm"] = "peagle"
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = D
    speculative = vllm_speculative("eagle3", D, parallel_drafting=True)
    export = Export(
        layout="peagle-vllm-speculators",
        engine=engine,
        config=config,
        tensors=tensors,
        layer_ids=base.layer_ids,
        serve=[vllm_serve(target.path, speculative)],
        speculative=speculative,
        served_depths=(1, D),
        notes=[
            "parallel_drafting must be true in the speculative config (vLLM leaves it off): without it vLLM "
            f"drafts autoregressively. num_speculative_tokens may be lowered, not raised above {D} (the depths "
            "trained)."
        ]
        + base.notes[1:],
    )
    shapes = {**spec.tensors, "mask_hidden": (1, 1, 3 * H), "embed_tokens.weight": (V, H)}
    spec = LayoutSpec(
        tensors=shapes,
        draft_vocab=spec.draft_vocab,
        dtypes=spec.dtypes,
        own_embedding=True,
        config={
            **spec.config,
            "speculators_model_type": "peagle",
            "mask_token_id": mask_id,
            "speculators_config.algorithm": "peagle",
        },
    )
    return export, spec
