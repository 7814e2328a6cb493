"""models/objectives.py against float64 dense oracles and the invariants of docs/ALGORITHMS-BLOCK.md section 3:
every objective's value and gradient, alpha's identities, D-PACE's limits and exp-decay's values."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.config.loader import ConfigError, load_config
from draftsmith.models.objectives import (
    OBJECTIVES,
    ObjectiveConfig,
    acceptance,
    chain_weights,
    dpace_weights,
    exp_decay_weights,
    masked_objective,
    token_objective,
)

N, V, CHUNK = 6, 23, 7  # 23 columns in slices of 7: four slices, the last one short


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from a second thread, and on a shared 2-core machine it costs several times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def logits(seed: int, scale: float = 2.0, n: int = N, v: int = V) -> torch.Tensor:
    return scale * torch.randn(n, v, generator=torch.Generator().manual_seed(seed))


def dense(kind: str, d: torch.Tensor, t: torch.Tensor, labels: torch.Tensor, kappa: float = 3.0):
    """The float64 oracle: the whole vocabulary at once, straight from the definitions."""
    log_q, log_p = d.double().log_softmax(-1), t.double().log_softmax(-1)
    p, q = log_p.exp(), log_q.exp()
    alpha = torch.minimum(p, q).sum(-1)
    kl = (p * (log_p - log_q)).sum(-1)
    if kind == "kl":
        return kl, alpha
    if kind == "ce":
        return -log_q.gather(1, labels[:, None]).squeeze(1), alpha
    if kind == "tv":
        return 1 - alpha, alpha
    if kind == "lk_alpha":
        return -alpha.clamp_min(1e-5).log(), alpha
    lam = torch.exp(-kappa * alpha.detach())
    return lam * kl + (1 - lam) * (1 - alpha), alpha


def grad_of(
    kind: str, d: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None, fn, **kw
) -> torch.Tensor:
    """d/d(draft logits) of the summed per-position objective (rows are independent, so row i is position i's)."""
    x = d.clone().requires_grad_(True)
    loss, _ = fn(kind, x, t, labels, **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return g


def chunked(kind, d, t, labels, **kw):
    return token_objective(kind, d, t, labels, vocab_chunk=CHUNK, **kw)


@pytest.mark.parametrize("kind", OBJECTIVES)
def test_every_objective_equals_its_float64_oracle(kind):
    d, t = logits(0), logits(1)
    labels = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(2))
    loss, alpha = chunked(kind, d, t, labels)
    want, want_alpha = dense(kind, d, t, labels)
    assert loss.dtype == alpha.dtype == torch.float32 and not alpha.requires_grad
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha.double(), want_alpha, rtol=1e-5, atol=1e-6)
    got_g = grad_of(kind, d, t, labels, chunked)
    want_g = grad_of(kind, d.double(), t.double(), labels, dense)
    torch.testing.assert_close(got_g.double(), want_g, rtol=1e-4, atol=1e-6)
    # the vocabulary slicing changes nothing: one slice gives the same values
    torch.testing.assert_close(
        loss, token_objective(kind, d, t, labels, vocab_chunk=V)[0], rtol=1e-6, atol=1e-6
    )


def test_bfloat16_logits_are_computed_in_float32():
    d, t = logits(3).bfloat16(), logits(4).bfloat16()
    loss, alpha = chunked("lk_lambda", d, t, None)
    want, want_alpha = dense("lk_lambda", d.float(), t.float(), torch.zeros(N, dtype=torch.long))
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha.double(), want_alpha, rtol=1e-5, atol=1e-6)


def test_one_minus_alpha_is_half_the_l1_distance_and_at_most_one():
    d, t = logits(5), logits(6)
    _, alpha = chunked("tv", d, t, None)
    l1 = (torch.softmax(d, -1) - torch.softmax(t, -1)).abs().sum(-1)
    torch.testing.assert_close(1 - alpha, 0.5 * l1, rtol=1e-5, atol=1e-6)
    assert bool((alpha <= 1 + 1e-6).all()) and bool((alpha < 0.999).all())


def test_alpha_is_one_iff_the_distributions_are_equal():
    t = logits(7)
    _, same = chunked("tv", t + 3.0, t, None)  # a constant shift leaves softmax unchanged
    torch.testing.assert_close(same, torch.ones(N), rtol=0, atol=1e-6)
    other = t.clone()
    other[:, 0] += 0.5  # any change of p moves alpha strictly below 1
    _, below = chunked("tv", other, t, None)
    assert bool((below < 1 - 1e-4).all())


def test_lk_alpha_gradient_is_the_tv_gradient_divided_by_alpha():
    d, t = logits(8, scale=1.0), logits(9, scale=1.0)
    _, alpha = chunked("tv", d, t, None)
    assert bool((alpha > 1e-5).all())  # no clamp in play
    g_lk = grad_of("lk_alpha", d, t, None, chunked)
    g_tv = grad_of("tv", d, t, None, chunked)
    torch.testing.assert_close(g_lk, g_tv / alpha[:, None], rtol=1e-5, atol=1e-7)


def test_lk_alpha_equals_cross_entropy_for_a_one_hot_target():
    d = logits(10)
    labels = torch.tensor([0, 5, 22, 7, 7, 13])
    t = torch.full((N, V), -1e4)
    t[torch.arange(N), labels] = 0.0  # p is exactly one-hot in float32
    lk, alpha = chunked("lk_alpha", d, t, None)
    ce = torch.nn.functional.cross_entropy(d, labels, reduction="none")
    torch.testing.assert_close(lk, ce, rtol=1e-5, atol=1e-6)
    # without target logits, ce's alpha is q(label): the acceptance probability of the one-hot target
    ce_loss, ce_alpha = chunked("ce", d, None, labels)
    torch.testing.assert_close(ce_loss, ce, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ce_alpha, alpha, rtol=1e-5, atol=1e-6)


def test_lk_lambda_gradient_mixes_kl_and_tv_with_lambda_frozen():
    d, t = logits(11), logits(12)
    kappa = 2.0
    _, alpha = chunked("tv", d, t, None)
    lam = torch.exp(-kappa * alpha)[:, None]
    g = grad_of("lk_lambda", d, t, None, chunked, kappa=kappa)
    g_kl, g_tv = grad_of("kl", d, t, None, chunked), grad_of("tv", d, t, None, chunked)
    torch.testing.assert_close(g, lam * g_kl + (1 - lam) * g_tv, rtol=1e-5, atol=1e-7)
    # kappa 0: lam = 1, pure KL; the KL gradient is the soft cross-entropy's (q - p)
    torch.testing.assert_close(grad_of("lk_lambda", d, t, None, chunked, kappa=0.0), g_kl)
    torch.testing.assert_close(g_kl, torch.softmax(d, -1) - torch.softmax(t, -1), rtol=1e-5, atol=1e-7)


def test_kl_is_zero_at_p_equal_q_and_nonnegative():
    t = logits(13)
    kl, _ = chunked("kl", t, t, None)
    torch.testing.assert_close(kl, torch.zeros(N), rtol=0, atol=1e-6)
    assert bool((chunked("kl", logits(14), t, None)[0] > 0).all())


def test_no_vocabulary_sized_float32_tensor_is_kept_beyond_the_inputs():
    """With the whole vocabulary in one slice, nothing vocabulary-sized but the inputs themselves is saved for
    backward: the slice's float32 p, q and logs are recomputed in the backward pass."""
    d, t = logits(15).requires_grad_(True), logits(16)
    inputs = {d.untyped_storage().data_ptr(), t.untyped_storage().data_ptr()}
    saved = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        if x.untyped_storage().data_ptr() not in inputs:
            saved.append(tuple(x.shape))
        return x

    for kind in OBJECTIVES:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            loss, _ = token_objective(kind, d, t, torch.zeros(N, dtype=torch.long), vocab_chunk=V)
        loss.sum().backward()
    assert saved and not [s for s in saved if V in s], saved


def test_acceptance_and_masked_objective_match_token_objective():
    d, t = logits(17).reshape(2, 3, V), logits(18).reshape(2, 3, V)
    _, alpha = chunked("tv", d.reshape(-1, V), t.reshape(-1, V), None)
    torch.testing.assert_close(acceptance(d, t, vocab_chunk=CHUNK), alpha.reshape(2, 3))
    w = torch.tensor([[1.0, 0.0, 2.5], [0.5, 1.0, 0.0]])
    mask = w > 0
    loss, alpha_sum = masked_objective("tv", d, t, None, w, mask, vocab_chunk=CHUNK)
    assert float(loss) == pytest.approx(float(((1 - alpha.reshape(2, 3)) * w).sum()), rel=1e-6)
    assert float(alpha_sum) == pytest.approx(float((alpha.reshape(2, 3) * mask).sum()), rel=1e-6)


def test_bad_arguments_say_what_is_missing():
    d = logits(19)
    with pytest.raises(ValueError, match="unknown objective 'foo'"):
        token_objective("foo", d, d)
    with pytest.raises(ValueError, match="ce objective needs label tokens"):
        token_objective("ce", d, d)
    with pytest.raises(ValueError, match="tv objective needs the target's logits"):
        token_objective("tv", d, None, torch.zeros(N, dtype=torch.long))


# ---- per-depth weights ------------------------------------------------------------------------------------


def test_exp_decay_weights_by_hand():
    torch.testing.assert_close(exp_decay_weights(3, 2.0), torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0)]))
    torch.testing.assert_close(exp_decay_weights(1, 4.0), torch.tensor([1.0]))


def test_dpace_by_hand():
    """D = 3, alpha = 0.5, CE = (0, ln 2, ln 4): q = (1, 1/2, 1/4), q~ = (1, 3/4, 5/8), C = (1, 3/4, 15/32),
    w = (1 + 3/4 + 15/32, 3/4 + 15/32, 15/32)."""
    ce = torch.tensor([0.0, math.log(2), math.log(4)])
    w = dpace_weights(ce, torch.ones(3, dtype=torch.bool), 0.5)
    c = torch.tensor([1.0, 0.75, 15 / 32])
    torch.testing.assert_close(w, torch.stack([c.sum(), c[1:].sum(), c[2]]))


@pytest.mark.parametrize("D", [1, 4, 7])
def test_dpace_limits(D):
    valid = torch.ones(2, D, dtype=torch.bool)
    linear = torch.arange(D, 0, -1).float().expand(2, D)  # (D, D-1, ..., 1): valid slots >= j
    ce = torch.rand(2, D, generator=torch.Generator().manual_seed(D)) * 3
    torch.testing.assert_close(dpace_weights(ce, valid, alpha=1.0), linear)  # alpha = 1
    torch.testing.assert_close(dpace_weights(torch.zeros(2, D), valid, alpha=0.3), linear)  # every q = 1
    # every q = 0: C_j = a^j, w_j = sum_{m=j..D} a^m = a^j (1 - a^(D-j+1)) / (1 - a) for 1-based j
    a = 0.5
    j = torch.arange(1, D + 1, dtype=torch.float64)
    want = a**j * (1 - a ** (D - j + 1)) / (1 - a)
    got = dpace_weights(torch.full((2, D), float("inf")), valid, alpha=a)
    torch.testing.assert_close(got.double(), want.expand(2, D))


def test_dpace_suffix_sum_is_the_total_minus_the_exclusive_prefix():
    ce = torch.rand(3, 6, generator=torch.Generator().manual_seed(1)) * 2
    valid = torch.ones(3, 6, dtype=torch.bool)
    w = dpace_weights(ce, valid, 0.4)
    c = torch.cumprod(0.4 + 0.6 * torch.exp(-ce), -1)
    torch.testing.assert_close(w, c.sum(-1, keepdim=True) - (torch.cumsum(c, -1) - c))


def test_dpace_invalid_slots_are_multiplicative_no_ops():
    ce = torch.tensor([0.3, 9.0, 1.2, 0.7, 5.0])
    valid = torch.tensor([True, False, True, True, False])
    w = dpace_weights(ce, valid, 0.5)
    compressed = dpace_weights(ce[valid], torch.ones(3, dtype=torch.bool), 0.5)
    torch.testing.assert_close(w[valid], compressed)
    assert float(w[~valid].abs().sum()) == 0.0


def test_dpace_inclusion_of_one_is_the_plain_weight():
    ce = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) * 2
    valid = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) > 0.3
    torch.testing.assert_close(dpace_weights(ce, valid, 0.4, torch.ones(3, 5)), dpace_weights(ce, valid, 0.4))


@pytest.mark.parametrize("D", [2, 5])
def test_dpace_of_subsampled_chains_is_unbiased(D):
    """Exact enumeration: slot m of a D-slot chain is drawn iff slot m-1 was and a coin of chance r_m lands
    (pi_m = prod r). For every slot j, the mean of the estimated weight over the drawn chain lengths, given that
    j was drawn, is the whole chain's weight."""
    ce = torch.rand(D, generator=torch.Generator().manual_seed(D)).double() * 2
    r = torch.tensor([1.0, *torch.linspace(0.9, 0.3, D - 1).tolist()], dtype=torch.float64)
    pi = torch.cumprod(r, 0)
    full = dpace_weights(ce, torch.ones(D, dtype=torch.bool), 0.5).double()
    for j in range(D):
        mean = 0.0
        for length in range(j + 1, D + 1):  # chains of `length` drawn slots; P(length | j drawn)
            stop = 1 - r[length] if length < D else 1.0
            chance = float(pi[length - 1] / pi[j] * stop)
            drawn = torch.arange(D) < length
            mean += chance * float(dpace_weights(ce, drawn, 0.5, pi.float())[j])
        assert math.isclose(mean, float(full[j]), rel_tol=1e-5), (j, mean, float(full[j]))


def test_dpace_inclusion_by_hand():
    """Slots 0, 1 drawn with chances 1, 1/2, CE = (0, ln 2), alpha = 0.5: C = (1, 3/4);
    w_0 = 1 * (1 + (3/4) / (1/2)) = 2.5, w_1 = (1/2) * (3/4) / (1/2) = 3/4; slot 2 was not drawn."""
    ce = torch.tensor([0.0, math.log(2), 0.0])
    w = dpace_weights(ce, torch.tensor([True, True, False]), 0.5, torch.tensor([1.0, 0.5, 0.25]))
    torch.testing.assert_close(w, torch.tensor([2.5, 0.75, 0.0]))


def test_dpace_weights_carry_no_gradient():
    ce = torch.rand(2, 4, requires_grad=True)
    w = dpace_weights(ce, torch.ones(2, 4, dtype=torch.bool))
    assert not w.requires_grad and w.grad_fn is None


def test_chain_weights_take_the_depths_of_one_column():
    ce = torch.rand(3, 2, 5, generator=torch.Generator().manual_seed(4))  # [D, B, T]
    valid = torch.rand(3, 2, 5, generator=torch.Generator().manual_seed(5)) > 0.3
    w = chain_weights(ce, valid, 0.5)
    for b in range(2):
        for t in range(5):
            torch.testing.assert_close(w[:, b, t], dpace_weights(ce[:, b, t], valid[:, b, t], 0.5))


# ---- the config section ----------------------------------------------------------------------------------


def test_term_weights_per_scheme():
    fixed = torch.tensor([0.8, 0.64, 0.512])
    assert ObjectiveConfig().term_weights(fixed) is fixed
    decay = ObjectiveConfig(weighting="exp_decay", decay_gamma=2.0).term_weights(fixed, scale=0.5)
    torch.testing.assert_close(decay, 0.5 * torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0)]))
    torch.testing.assert_close(
        ObjectiveConfig(weighting="dpace").term_weights(fixed, 2.0), torch.full((3,), 2.0)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "foo"}, r"objective\.loss must be one of kl, ce, tv, lk_alpha, lk_lambda"),
        ({"weighting": "linear"}, r"objective\.weighting must be one of fixed, exp_decay, dpace"),
        ({"lk_kappa": -1.0}, r"objective\.lk_kappa must be a finite number >= 0"),
        ({"decay_gamma": 0.0}, r"objective\.decay_gamma must be a finite number > 0"),
        ({"dpace_alpha": 0.0}, r"objective\.dpace_alpha must be in \(0, 1\]"),
    ],
)
def test_config_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ObjectiveConfig(**kwargs)


def test_config_loader_reads_the_section_and_names_a_bad_value():
    cfg = load_config(ObjectiveConfig, None, ["loss=lk_lambda", "weighting=dpace", "dpace_alpha=0.3"])
    assert (cfg.loss, cfg.weighting, cfg.dpace_alpha, cfg.lk_kappa) == ("lk_lambda", "dpace", 0.3, 3.0)
    with pytest.raises(ConfigError, match=r"^loss: expected one of .*'lk_lambda'.*did you mean 'lk_alpha'\?"):
        load_config(ObjectiveConfig, None, ["loss=lk_alpa"])
