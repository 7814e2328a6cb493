"""Distillation divergences against direct float64 numpy computations (ALGORITHMS.md section 8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.divergences import divergence


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference(p: np.ndarray, q: np.ndarray, kind: str, beta: float) -> np.ndarray:
    """Textbook definitions, float64, one row per position."""
    if kind == "fkl":
        return (p * np.log(p / q)).sum(-1)
    if kind == "rkl":
        return (q * np.log(q / p)).sum(-1)
    if kind == "jsd":
        m = beta * p + (1 - beta) * q
        return beta * (p * np.log(p / m)).sum(-1) + (1 - beta) * (q * np.log(q / m)).sum(-1)
    if kind == "tvd":
        return 0.5 * np.abs(p - q).sum(-1)
    raise AssertionError(kind)


def random_logits(n: int, v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # peaked and flat rows both: scales from 0.3 to 6
    scale = torch.linspace(0.3, 6.0, n)[:, None]
    return torch.randn(n, v, generator=g) * scale, torch.randn(n, v, generator=g) * scale.flip(0)


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tvd"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_divergence_matches_float64_numpy(kind, temperature):
    t, d = random_logits(16, 50, seed=1)
    beta = 0.3
    got, accept = divergence(t, d, kind, beta=beta, temperature=temperature, vocab_chunk=7)
    p = softmax64(t.double().numpy() / temperature)
    q = softmax64(d.double().numpy() / temperature)
    np.testing.assert_allclose(got.numpy(), reference(p, q, kind, beta), rtol=2e-5, atol=1e-6)
    # the acceptance identity alpha = sum min(p, q) = 1 - TVD (Leviathan et al. Cor. 3.6)
    np.testing.assert_allclose(accept.numpy(), np.minimum(p, q).sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(accept.numpy(), 1 - reference(p, q, "tvd", beta), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tvd"])
def test_chunked_gradient_equals_one_chunk(kind):
    t, d = random_logits(6, 33, seed=2)
    grads = []
    for chunk in (5, 33):
        x = d.clone().requires_grad_(True)
        div, _ = divergence(t, x, kind, vocab_chunk=chunk)
        (div * torch.arange(1.0, 7.0)).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_kl_direction_and_torch_argument_order():
    """fkl = KL(p || q) with p the TARGET: F.kl_div(input=log q, target=log p) computes exactly that, and it
    differs from KL(q || p) on asymmetric distributions (a swapped argument order would fail here)."""
    t = torch.tensor([[4.0, 0.0, -2.0, -2.0]])
    d = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    fkl, _ = divergence(t, d, "fkl")
    rkl, _ = divergence(t, d, "rkl")
    log_p, log_q = F.log_softmax(t, -1), F.log_softmax(d, -1)
    torch.testing.assert_close(fkl, F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1))
    torch.testing.assert_close(rkl, F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1))
    p = log_p.exp()[0].double()
    by_hand = float((p * (p.log() - np.log(0.25))).sum())  # KL(p || uniform) = log 4 - H(p)
    assert float(fkl) == pytest.approx(by_hand, rel=1e-5)
    assert abs(float(fkl) - float(rkl)) > 0.1


def test_forward_kl_covers_modes_reverse_kl_seeks_one():
    """The classic picture: fitting one Gaussian-like bump to a two-mode target. FKL's gradient at a draft
    that sits on one mode pushes mass toward the other mode; RKL's does not."""
    t = torch.log(torch.tensor([[0.49, 0.02, 0.49]]))
    d = torch.log(torch.tensor([[0.96, 0.02, 0.02]])).requires_grad_(True)
    divergence(t, d, "fkl")[0].sum().backward()
    assert d.grad is not None
    fkl_grad = d.grad.clone()
    d.grad = None
    divergence(t, d, "rkl")[0].sum().backward()
    assert d.grad is not None
    assert fkl_grad[0, 2] < 0  # descending raises the missing mode's logit
    assert abs(float(d.grad[0, 2])) < abs(float(fkl_grad[0, 2])) / 5


def test_identical_distributions_give_zero_and_full_acceptance():
    t, _ = random_logits(4, 20, seed=3)
    for kind in ("fkl", "rkl", "jsd", "tvd"):
        div, accept = divergence(t, t.clone(), kind)
        torch.testing.assert_close(div, torch.zeros(4), atol=1e-6, rtol=0)
        torch.testing.assert_close(accept, torch.ones(4))


def test_target_never_gets_a_gradient_and_bad_arguments_are_refused():
    t, d = random_logits(3, 10, seed=4)
    t.requires_grad_(True)
    d.requires_grad_(True)
    divergence(t, d, "jsd")[0].sum().backward()
    assert t.grad is None and d.grad is not None
    with pytest.raises(ValueError, match="0 < beta < 1"):
        divergence(t, d, "jsd", beta=0.0)
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence(t, d, "kl")
    with pytest.raises(ValueError, match="one shape"):
        divergence(t, d[:, :5], "fkl")
