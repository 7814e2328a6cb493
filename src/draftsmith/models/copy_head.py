"""`draft.layer_init: copy`: one key/value group of the EAGLE-3 draft layer built as a copy head before training.

Prompt lookup's gain is copying: the token that followed an earlier occurrence of the current one. In EAGLE-3's
layout column j of the draft layer reads the embedding of x_{j+1} and the target's features g_j, and column t
predicts x_{t+2}, so copying is one attention step: column t's query stands for x_{t+1}, column j's key for
x_j, its value for x_{j+1}. Trained drafters do not find that step at the budgets measured (docs/BENCHMARKS.md,
"What one draft layer can copy"), though the features say which token x_j is well enough: a linear read of
them matched in the rotary embedding's slow dimensions copies nearly as well as a one-token lookup
(`bench.copy_ceiling`). This module builds that head into the layer's weights, so an engine serves it as any
other EAGLE-3 drafter (same tensors, same shapes):

    query heads of group 0 (all reading kv head 0)  q = beta P^T C norm_in(embed(x_{t+1}))
    kv head 0                                       k = beta P^T R^T norm_hidden(fc(g_j))
                                                    v = B^T C norm_in(embed(x_{j+1}))
    their output columns                            o = gamma B v / group

fc's columns of the later taps start scaled down (`quiet_later_taps`): the
key's linear read of the first tap needs them quiet, and training scales them back up.
C removes the mean direction of the data's token embeddings; R is the ridge map from the hidden half to those
centred embeddings, fitted on the training data's own features; P is a seeded random projection kept to the
dimensions whose rotary angle stays under half a radian over `span` positions (a match must not depend on how
far back it is); B an orthonormal basis of `head_dim` directions. beta sets the score of a column whose key is
the query's own token to SHARPNESS (after attention's 1/sqrt(head_dim)); gamma makes the written value
OUT_SCALE times the residual's norm. The rest of the layer keeps its random start.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .draft_layer import draft_layer_settings
from .target import FrozenTarget, LayerId

FIT_TOKENS = 65536  # positions of the training data the key map is fitted on
SHARPNESS = 30.0
TAP_MIX = 0.1
OUT_SCALE = 2.0
RIDGE = 1e-3


def stable_dims(head_dim: int, theta: float, span: int, max_angle: float = 0.5) -> torch.Tensor:
    """`[head_dim]` bool: the dimensions whose rotary angle stays under `max_angle` radians over `span`
    positions (transformers' layout: dims i and i + head_dim/2 turn at theta^(-2i/head_dim))."""
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    keep = freq * span < max_angle
    return torch.cat([keep, keep])


def ridge_read(gram: torch.Tensor, cross: torch.Tensor, count: int, ridge: float = RIDGE) -> torch.Tensor:
    """`[F, H]` ridge map without intercept from accumulated `gram = X^T X [F, F]` and `cross = X^T Y [F, H]`
    over `count` rows. Columns are scaled to unit mean square for the penalty (a few massive activations would
    otherwise own it) and the scale is folded back, so `X @ map` fits Y."""
    gram, cross = gram.double(), cross.double()
    scale = (gram.diagonal() / count).sqrt().clamp_min(1e-6)
    eye = torch.eye(len(scale), dtype=gram.dtype, device=gram.device)
    scaled = gram / scale[:, None] / scale[None] + ridge * count * eye
    return torch.linalg.solve(scaled, cross / scale[:, None]) / scale[:, None]


@torch.no_grad()
def quiet_later_taps(
    fc_weight: torch.Tensor, features: torch.Tensor, hidden: int, mix: float = TAP_MIX
) -> None:
    """Scale fc's columns of every tap after the first so that each adds `mix` times the first tap's mean norm
    to fc's output. The first (lowest) tap says which token a position holds; the later ones, whose norms are
    5-10x larger in a pretrained target, would drown it in the key's linear read."""
    first = (features[:, :hidden] @ fc_weight[:, :hidden].T).norm(dim=-1).mean()
    for start in range(hidden, features.shape[1], hidden):
        block = fc_weight[:, start : start + hidden]
        own = (features[:, start : start + hidden] @ block.T).norm(dim=-1).mean().clamp_min(1e-12)
        block.mul_(mix * first / own)


@torch.no_grad()
def init_copy_head(
    draft: Any,
    settings: dict[str, Any],
    emb: torch.Tensor,
    features: torch.Tensor,
    ids: torch.Tensor,
    span: int,
) -> None:
    """Build kv head 0 of `draft.layer` and its query heads as a copy head (module docstring).

    Args:
        draft: an EAGLE-3 drafter (`fc`, `norm_in`, `norm_hidden`, `layer` with Llama q/k/v/o projections).
        settings: its `draft_layer_settings` (heads, kv heads, head_dim, rope).
        emb: the target's input embedding table `[V, H]`.
        features: the target's concatenated taps `[N, 3H]` at N positions of the training data.
        ids: the token at each of those positions `[N]` (the token the features at that position stand for).
        span: the positions a match must reach across (the data's longest sample).
    """
    heads, kv_heads, hd = (
        int(settings[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
    )
    group = heads // kv_heads
    q, k, v, o = (draft.layer.get_parameter(f"self_attn.{n}_proj.weight") for n in "qkvo")
    H = emb.shape[1]
    if q.shape[1] != 2 * H or k.shape[0] != kv_heads * hd:
        raise ValueError("draft.layer_init=copy builds a Llama-style fused EAGLE-3 layer's heads; use random")
    work = torch.float64
    token = draft.norm_in(emb[ids].to(q.dtype)).to(work)
    mean = token.mean(0)
    eye = torch.eye(H, dtype=work, device=q.device)
    centre = eye - torch.outer(mean, mean) / mean.dot(mean).clamp_min(1e-12)
    token = token @ centre
    quiet_later_taps(draft.fc.weight, features.to(q.dtype), H)
    fused = draft.fc(features.to(q.dtype))
    hidden_half = draft.norm_hidden(fused).to(work)
    read = ridge_read(hidden_half.T @ hidden_half, hidden_half.T @ token, len(ids))
    gen = torch.Generator().manual_seed(0)
    theta = float(settings["rope_parameters"]["rope_theta"])
    keep = stable_dims(hd, theta, span).to(q.device)
    if not keep.any():
        raise ValueError(f"no rotary dimension of this draft layer stays still over {span} positions")
    proj = torch.randn(H, hd, generator=gen, dtype=work).to(q.device) * keep.to(work)
    basis = torch.linalg.qr(torch.randn(H, hd, generator=gen, dtype=work).to(q.device))[0]
    query_dir, key_dir = centre @ proj, read @ proj
    matched = ((token @ proj) * (hidden_half @ key_dir)).sum(-1).mean()
    if not matched > 0:
        raise ValueError(
            "the target's features do not say which token they stand for; use draft.layer_init=random"
        )
    beta = math.sqrt(SHARPNESS * math.sqrt(hd) / float(matched))
    gamma = OUT_SCALE * fused.norm(dim=-1).mean() / (token @ basis).norm(dim=-1).mean()
    zeros = torch.zeros(hd, H, dtype=work, device=q.device)
    for h in range(group):
        q[h * hd : (h + 1) * hd] = torch.cat([beta * query_dir.T, zeros], 1).to(q.dtype)
        o[:, h * hd : (h + 1) * hd] = (gamma / group * basis).to(o.dtype)
    k[:hd] = torch.cat([zeros, beta * key_dir.T], 1).to(k.dtype)
    v[:hd] = torch.cat([(centre @ basis).T, zeros], 1).to(v.dtype)


def copy_head_slices(
    draft: Any, settings: dict[str, Any], whole_fc: bool = False
) -> dict[str, tuple[slice, slice]]:
    """`{parameter name: (rows, columns)}`: what the copy head is in `draft`'s weights (module docstring), fc's
    first-tap columns included (the key's read of which token a position holds), or with `whole_fc` all of fc
    (the key reads fc's whole output, so the later taps' columns move it too)."""
    heads, kv_heads, hd = (
        int(settings[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
    )
    rows, every = slice(0, hd * heads // kv_heads), slice(None)
    hidden = draft.fc.weight.shape[0]
    return {
        "layer.self_attn.q_proj.weight": (rows, every),
        "layer.self_attn.k_proj.weight": (slice(0, hd), every),
        "layer.self_attn.v_proj.weight": (slice(0, hd), every),
        "layer.self_attn.o_proj.weight": (every, rows),
        "fc.weight": (every, every if whole_fc else slice(0, hidden)),
    }


def freeze_copy_head(draft: Any, settings: dict[str, Any], whole_fc: bool = False) -> None:
    """`draft.freeze_copy_head`: zero the gradient of the copy head's slices (`copy_head_slices`), so that the
    optimizer leaves them as built (AdamW without weight decay moves nothing whose gradient is always zero;
    with decay they would shrink). Hooks on the parameters: one process or DDP; FSDP and DeepSpeed shard or
    flatten the parameters the hooks hold, and a run under either refuses the option (train/eagle.py)."""
    for name, (rows, cols) in copy_head_slices(draft, settings, whole_fc).items():
        param = draft.get_parameter(name)
        keep = torch.ones_like(param)
        keep[rows, cols] = 0
        param.register_hook(_masked(keep))


def _masked(keep: torch.Tensor) -> Any:
    """A gradient hook multiplying by `keep`, moved once to each device and dtype a gradient arrives on
    (accelerate moves the drafter after it is built)."""
    moved: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def hook(grad: torch.Tensor) -> torch.Tensor:
        key = (grad.device, grad.dtype)
        if key not in moved:
            moved[key] = keep.to(grad.device, grad.dtype)
        return grad * moved[key]

    return hook


def copy_head_data(
    dataset: Any, target: FrozenTarget, layers: list[LayerId], tokens: int = FIT_TOKENS
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The concatenated taps `[N, 3H]` and tokens `[N]` of the training data's first samples (at least `tokens`
    positions; cached, or computed by the target on its device), on the CPU, and the longest sample's length."""
    feats, ids, n = [], [], 0
    for i in range(len(dataset)):
        if n >= tokens:
            break
        item = dataset[i]
        batch = {
            key: value[None].to(target.device)
            for key, value in item.items()
            if isinstance(value, torch.Tensor)
        }
        batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))
        got, _ = target.batch_features(batch, layers)
        feats.append(torch.cat([got[lid][0] for lid in layers], -1).float().cpu())
        ids.append(batch["input_ids"][0].long().cpu())
        n += len(ids[-1])
    if not ids:
        raise ValueError("draft.layer_init=copy fits its key map on the training data, and it has no samples")
    return torch.cat(feats), torch.cat(ids), max(len(x) for x in ids)


def init_copy_head_from_data(draft: Any, target: FrozenTarget, dataset: Any) -> None:
    """`draft.layer_init: copy` for a training run: the copy head fitted on `dataset`'s first samples, where the
    drafter is (the target may be on a GPU while the drafter is still built on the CPU)."""
    features, ids, span = copy_head_data(dataset, target, list(draft.feature_layers))
    device = draft.fc.weight.device
    settings = draft_layer_settings(target.model.config)
    emb = target.embed_tokens.weight.detach().to(device)
    init_copy_head(draft, settings, emb, features.to(device), ids.to(device), span)
    if draft.config.freeze_copy_head != "off":
        freeze_copy_head(draft, settings, whole_fc=draft.config.freeze_copy_head == "head_and_fc")
