"""Acceptance-optimizing objectives and per-depth weights for every head family (docs/ALGORITHMS-BLOCK.md
section 3): pure functions, computed in float32 over vocabulary slices, knowing nothing of ranks.

p is the target's distribution, q the draft's, alpha = sum_v min(p_v, q_v) the probability that one lossless
speculative-sampling step accepts a token drawn from q (ALGORITHMS.md 9.2). The objectives of one position:

    kl         KL(p || q)                             (0 when q = p; the same gradient as soft cross-entropy)
    ce         -log q(label)                          (hard cross-entropy on a label token)
    tv         1 - alpha                              (= total variation 1/2 ||p - q||_1)
    lk_alpha   -log max(alpha, 1e-5)                  (gradient of tv divided by alpha)
    lk_lambda  lam KL(p || q) + (1 - lam)(1 - alpha),  lam = exp(-kappa sg(alpha)) per position

The per-depth weights (`exp_decay_weights`, `dpace_weights`) weigh the drafts of one chain: the depths
rooted at one column (Medusa head k, EAGLE-3 TTT step s = depth s+1, MTP module k).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.utils.checkpoint

from .chunking import recomputing

Objective = Literal["kl", "ce", "tv", "lk_alpha", "lk_lambda"]
Weighting = Literal["fixed", "exp_decay", "dpace"]
OBJECTIVES: tuple[Objective, ...] = ("kl", "ce", "tv", "lk_alpha", "lk_lambda")
WEIGHTINGS: tuple[Weighting, ...] = ("fixed", "exp_decay", "dpace")
ALPHA_FLOOR = 1e-5  # lk_alpha's clamp: -log alpha stays finite (<= 11.5) where the overlap vanishes


@dataclass
class ObjectiveConfig:
    """What each draft position is trained to minimise and how the depths of a chain are weighted (the
    `objective:` section of the Medusa, EAGLE and MTP recipes)."""

    loss: Objective | None = field(
        default=None,
        metadata={
            "help": "Per-position objective: kl, ce, tv, lk_alpha, lk_lambda; null = the family's classic loss "
            "(Medusa and MTP: ce on the data's tokens; EAGLE-1/3: soft cross-entropy against the target)."
        },
    )
    lk_kappa: float = field(
        default=3.0,
        metadata={"help": "lk_lambda: lam = exp(-lk_kappa * alpha) per position (speculators: 3)."},
    )
    weighting: Weighting = field(
        default="fixed",
        metadata={
            "help": "Per-depth weights: fixed = the family's own (Medusa loss_decay / head_weights, EAGLE-3 "
            "step_decay, MTP uniform); exp_decay = exp(-(k-1)/decay_gamma); dpace = D-PACE per position."
        },
    )
    decay_gamma: float = field(default=4.0, metadata={"help": "exp_decay: depth k weighs exp(-(k-1)/gamma)."})
    dpace_alpha: float = field(
        default=0.5, metadata={"help": "dpace: confidence floor, q~ = (1 - a) exp(-CE) + a, 0 < a <= 1."}
    )

    def __post_init__(self) -> None:
        if self.loss is not None and self.loss not in OBJECTIVES:
            raise ValueError(
                f"objective.loss must be one of {', '.join(OBJECTIVES)} (or null for the family's classic loss), "
                f"got {self.loss!r}"
            )
        if self.weighting not in WEIGHTINGS:
            raise ValueError(
                f"objective.weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}"
            )
        if not (math.isfinite(self.lk_kappa) and self.lk_kappa >= 0):
            raise ValueError(
                f"objective.lk_kappa must be a finite number >= 0 (e.g. 3.0), got {self.lk_kappa}"
            )
        if not (math.isfinite(self.decay_gamma) and self.decay_gamma > 0):
            raise ValueError(
                f"objective.decay_gamma must be a finite number > 0 (e.g. 4.0), got {self.decay_gamma}"
            )
        if not 0 < self.dpace_alpha <= 1:
            raise ValueError(f"objective.dpace_alpha must be in (0, 1] (e.g. 0.5), got {self.dpace_alpha}")

    def term_weights(self, fixed: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """The per-depth term weights `[D]`: `fixed` (the family's own, returned as is) under `fixed`;
        `scale * exp_decay_weights` under exp_decay; `scale` for every depth under dpace (its weights are
        per position). `scale` is the family's coefficient that is not a depth weight (MTP's loss_weight,
        Medusa-2's heads_coefficient, EAGLE-1's cls_weight)."""
        if self.weighting == "fixed":
            return fixed
        if self.weighting == "exp_decay":
            return scale * exp_decay_weights(len(fixed), self.decay_gamma)
        return torch.full((len(fixed),), float(scale))


def exp_decay_weights(depths: int, gamma: float) -> torch.Tensor:
    """`[D]` float32, depth k = 1..D weighs exp(-(k-1)/gamma) (depth 1 weighs 1)."""
    if depths < 1 or not gamma > 0:
        raise ValueError(f"exp_decay_weights needs depths >= 1 and gamma > 0, got {depths} and {gamma}")
    return torch.exp(-torch.arange(depths, dtype=torch.float64) / gamma).float()


@torch.no_grad()
def dpace_weights(
    ce: torch.Tensor, valid: torch.Tensor, alpha: float = 0.5, inclusion: torch.Tensor | None = None
) -> torch.Tensor:
    """D-PACE per-position weights of chains of D drafts (no gradient).

    With q_j = exp(-CE_j) the draft's confidence in slot j's label: q~_j = (1 - alpha) q_j + alpha on valid
    slots and 1 on invalid ones (a multiplicative no-op), C_j = prod_{i<=j} q~_i, and
    w_j = v_j * sum_{m>=j} v_m C_m (the cumulative confidence times the value of continuing the chain).

    Chains whose deeper slots are a random subsample (P-EAGLE's COD sampling) pass each slot's chance of being
    drawn, pi_j; the sum then runs over the drawn slots with each term divided by its chance given slot j's,
    w_j = v_j pi_j sum_{m>=j} v_m C_m / pi_m, whose expectation over the draws is the whole chain's weight
    (Horvitz-Thompson).

    Args:
        ce: `[..., D]` per-slot cross-entropy, depth last (any value where `valid` is False).
        valid: `[..., D]` bool, the slots that are trained (and, subsampled, drawn).
        alpha: the confidence floor, 0 < alpha <= 1 (1 gives w_j = the number of valid slots >= j).
        inclusion: None (every slot present), or `[..., D]` the chance pi_j > 0 that slot j was drawn (any
            positive value where `valid` is False).

    Returns:
        `[..., D]` float32 weights, 0 on invalid slots.
    """
    ce = ce.detach().float()
    v = valid.bool()
    s = torch.where(v, alpha + (1.0 - alpha) * torch.exp(-ce), torch.ones_like(ce))
    c = torch.cumprod(s, dim=-1) * v
    if inclusion is None:
        return c.flip(-1).cumsum(-1).flip(-1) * v
    pi = inclusion.detach().float()
    return (c / pi).flip(-1).cumsum(-1).flip(-1) * pi * v


def _slice_lse(x: torch.Tensor) -> torch.Tensor:
    return x.float().logsumexp(-1)


def _logsumexp(x: torch.Tensor, vocab_chunk: int) -> torch.Tensor:
    """`logsumexp(x.float(), -1)` `[N]` over vocabulary slices, each recomputed in backward."""
    parts = []
    for start in range(0, x.shape[1], vocab_chunk):
        piece = x[:, start : start + vocab_chunk]
        if piece.requires_grad and torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(_slice_lse, piece, use_reentrant=False))
        else:
            parts.append(_slice_lse(piece))
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)


def _slice_terms(
    t_slice: torch.Tensor,
    d_slice: torch.Tensor,
    lse_t: torch.Tensor,
    lse_d: torch.Tensor,
    with_kl: bool,
    alpha_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One vocabulary slice `[N, C]`: its contributions `[N]` to KL(p || q) (0 unless `with_kl`) and to
    alpha = sum_v min(p, q) (without gradient unless `alpha_grad`)."""
    log_p = t_slice.float() - lse_t[:, None]
    log_q = d_slice.float() - lse_d[:, None]
    p, q = log_p.exp(), log_q.exp()
    kl = (p * (log_p - log_q)).sum(-1) if with_kl else log_q.new_zeros(log_q.shape[0])
    # Under no_grad when not needed, not `.detach()`: a recorded op would keep p and q until backward ends.
    with torch.set_grad_enabled(alpha_grad and torch.is_grad_enabled()):
        alpha = torch.minimum(p, q).sum(-1)
    return kl, alpha


def _kl_and_alpha(
    target: torch.Tensor,
    draft: torch.Tensor,
    lse_d: torch.Tensor,
    with_kl: bool,
    alpha_grad: bool,
    vocab_chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    lse_t = _logsumexp(target, vocab_chunk)
    kl = lse_d.new_zeros(draft.shape[0], dtype=torch.float32)
    alpha = torch.zeros_like(kl)
    grad = (with_kl or alpha_grad) and draft.requires_grad and torch.is_grad_enabled()
    for start in range(0, draft.shape[1], vocab_chunk):
        cols = slice(start, start + vocab_chunk)
        args = (target[:, cols], draft[:, cols], lse_t, lse_d, with_kl, alpha_grad)
        if grad:
            k, a = torch.utils.checkpoint.checkpoint(_slice_terms, *args, use_reentrant=False)
        else:  # nothing of this slice needs a gradient (ce's alpha metric)
            with torch.no_grad():
                k, a = _slice_terms(*args)
        kl, alpha = kl + k, alpha + a
    return kl, alpha


def token_objective(
    kind: str,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    *,
    kappa: float = 3.0,
    vocab_chunk: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position objective `kind` (one of `OBJECTIVES`) and acceptance probability alpha.

    Computed in float32 over vocabulary slices of `vocab_chunk` columns, each recomputed in the backward
    (activation checkpointing), so no float32 `[N, Vd]` intermediate beyond one slice is kept.

    Args:
        kind: kl, ce, tv, lk_alpha or lk_lambda (see the module docstring).
        draft_logits: `[N, Vd]` the draft's logits (any float dtype); q = softmax(draft_logits).
        target_logits: `[N, Vd]` the target's logits over the same vocabulary (the caller restricts them to
            the draft vocabulary); p = softmax(target_logits), never differentiated. Required except for ce.
        labels: `[N]` long, the label tokens of ce (draft-vocabulary ids).
        kappa: lk_lambda's lam = exp(-kappa * alpha) per position, alpha not differentiated.

    Returns:
        `(loss [N] float32 with gradient, alpha [N] float32 without)`. alpha is sum_v min(p, q); for ce
        without target logits it is q(label), the acceptance probability of a one-hot target.
    """
    if kind not in OBJECTIVES:
        raise ValueError(f"unknown objective {kind!r}: use one of {', '.join(OBJECTIVES)}")
    if draft_logits.dim() != 2:
        raise ValueError(f"token_objective needs [N, Vd] draft logits, got {tuple(draft_logits.shape)}")
    if kind == "ce" and labels is None:
        raise ValueError("the ce objective needs label tokens")
    if kind != "ce" and target_logits is None:
        raise ValueError(f"the {kind} objective needs the target's logits")
    if target_logits is not None and target_logits.shape != draft_logits.shape:
        raise ValueError(
            f"target logits {tuple(target_logits.shape)} and draft logits {tuple(draft_logits.shape)} differ"
        )
    lse_d = _logsumexp(draft_logits, vocab_chunk)
    log_q_label = None
    if labels is not None:
        log_q_label = draft_logits.gather(1, labels.long()[:, None]).squeeze(1).float() - lse_d
    if target_logits is None:
        assert log_q_label is not None
        return -log_q_label, log_q_label.detach().exp()
    with_kl, alpha_grad = kind in ("kl", "lk_lambda"), kind in ("tv", "lk_alpha", "lk_lambda")
    kl, alpha = _kl_and_alpha(target_logits.detach(), draft_logits, lse_d, with_kl, alpha_grad, vocab_chunk)
    if kind == "kl":
        loss = kl
    elif kind == "ce":
        assert log_q_label is not None
        loss = -log_q_label
    elif kind == "tv":
        loss = 1.0 - alpha
    elif kind == "lk_alpha":
        loss = -alpha.clamp_min(ALPHA_FLOOR).log()
    else:
        lam = torch.exp(-kappa * alpha.detach())
        loss = lam * kl + (1.0 - lam) * (1.0 - alpha)
    return loss, alpha.detach()


@torch.no_grad()
def acceptance(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, vocab_chunk: int = 8192
) -> torch.Tensor:
    """alpha = sum_v min(p, q) `[...]` (no gradient) from `[..., Vd]` logits of one vocabulary, in slices."""
    vd = draft_logits.shape[-1]
    d, t = draft_logits.reshape(-1, vd), target_logits.reshape(-1, vd)
    alpha = _kl_and_alpha(t, d, _logsumexp(d, vocab_chunk), False, False, vocab_chunk)[1]
    return alpha.reshape(draft_logits.shape[:-1])


def masked_objective(
    kind: str,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor | None,
    labels: torch.Tensor | None,
    weights: torch.Tensor,
    mask: torch.Tensor,
    *,
    kappa: float = 3.0,
    vocab_chunk: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_objective` over the positions of a `[B, c, Vd]` chunk, as sums.

    Args:
        weights: `[B, c]` float, each position's weight in the loss (0 where untrained; D-PACE weights).
        mask: `[B, c]` bool, the positions whose alpha the metric counts.

    Returns:
        `(sum of weights * loss [1], sum of alpha over mask [1])`.
    """
    vd = draft_logits.shape[-1]
    loss, alpha = token_objective(
        kind,
        draft_logits.reshape(-1, vd),
        None if target_logits is None else target_logits.reshape(-1, vd),
        None if labels is None else labels.reshape(-1),
        kappa=kappa,
        vocab_chunk=vocab_chunk,
    )
    return (loss * weights.reshape(-1)).sum().reshape(1), (alpha * mask.reshape(-1)).sum().reshape(1)


def acceptance_sum(
    draft_logits: torch.Tensor, target_logits: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """The alpha metric of a chunk under the classic losses: sum of alpha over `mask` `[1]`; 0 while
    `recomputing()` or without target logits (callers skip computing them while recomputing)."""
    if target_logits is None or recomputing():
        return draft_logits.new_zeros(1, dtype=torch.float32)
    return (acceptance(draft_logits, target_logits) * mask).sum().reshape(1)


@torch.no_grad()
def per_column(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], chunk: int) -> torch.Tensor:
    """`fn` over sequence chunks of `chunk` positions under no_grad, concatenated along dim 1: a per-column
    quantity (e.g. D-PACE's cross-entropy) `[B, T, ...]` whose vocabulary-sized logits exist one chunk at a
    time. `fn(*chunks) -> [B, c, ...]`, every input `[B, T, ...]` sliced along dim 1."""
    return torch.cat(
        [fn(*(x[:, s : s + chunk] for x in inputs)) for s in range(0, inputs[0].shape[1], chunk)], dim=1
    )


def chain_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """`dpace_weights` of per-depth rows: `ce`, `valid` `[D, B, T]` (depth first, a chain = the depths of one
    column) -> `[D, B, T]` weights."""
    return dpace_weights(ce.movedim(0, -1), valid.movedim(0, -1), alpha).movedim(-1, 0)
