"""The fast sampler draws from exactly the distribution of transformers' warpers (eval/sampling.py's oracle)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

from draftsmith.data.nucleus import DrawnToken, draw, nucleus
from draftsmith.eval.sampling import Sampling

SETTINGS = [(0.8, 0.95, 0), (1.0, 0.5, 0), (0.7, 0.9, 40), (1.3, 1.0, 0), (0.5, 0.99, 7)]


def peaked_logits(rows: int = 32, vocab: int = 3000, seed: int = 0) -> torch.Tensor:
    """Language-model-like rows: a few likely tokens over a long tail, some rows flatter than others."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    logits[:, :20] += torch.linspace(8, 1, 20)  # a head of likely tokens
    return logits * torch.linspace(0.3, 1.5, rows)[:, None]  # flat rows first, peaked rows last


def dense(probs: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.zeros(probs.shape[0], vocab).scatter_(1, ids, probs)


@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
def test_nucleus_over_candidates_is_the_warpers_distribution_where_it_says_so(temperature, top_p, top_k):
    logits = peaked_logits()
    oracle = Sampling(temperature, top_p, top_k).probs(logits)
    for width in (16, 64, logits.shape[1]):
        probs, ids, covered = nucleus(logits, temperature, top_p, top_k, width)
        got = dense(probs, ids, logits.shape[1])
        got = got / got.sum(-1, keepdim=True)
        assert torch.equal(got[covered] > 0, oracle[covered] > 0)  # the same kept tokens
        torch.testing.assert_close(got[covered], oracle[covered], atol=1e-6, rtol=1e-5)
        # a row flagged uncovered has mass under top_p in its candidates: its nucleus may be wider
        assert (probs.sum(-1)[~covered] < top_p).all()
    assert nucleus(logits, temperature, top_p, top_k, logits.shape[1])[2].all()  # the whole vocabulary


def test_narrow_candidates_leave_flat_rows_to_the_whole_vocabulary():
    logits = peaked_logits()
    covered = nucleus(logits, 0.8, 0.95, 0, width=16)[2]
    # the flattest row's nucleus is wider than 16, the most peaked's not
    assert not covered[0] and covered[-1]


@pytest.mark.parametrize("width", [8, 4096])
def test_draws_follow_the_distribution_in_fallback_rows_and_covered_rows(width):
    """Empirical frequencies over 40,000 draws against the oracle's probabilities: a wide row (10 near-equal
    tokens, no ties: its nucleus of 9 is wider than 8 candidates and falls back) and a peaked one."""
    vocab = 50
    row_flat = torch.full((vocab,), -30.0)
    row_flat[:10] = torch.linspace(0.3, 0.0, 10)
    row_peak = torch.linspace(4, -4, vocab)
    logits = torch.stack([row_flat, row_peak]).repeat(20_000, 1)
    g = torch.Generator().manual_seed(1)
    tokens = draw(logits, 0.9, 0.9, 0, generator=g, width=width).view(20_000, 2)
    oracle = Sampling(0.9, 0.9).probs(logits[:2])
    for r in range(2):
        freq = torch.bincount(tokens[:, r], minlength=vocab).float() / tokens.shape[0]
        assert ((freq > 0) <= (oracle[r] > 0)).all()  # nothing drawn outside the nucleus
        assert (freq - oracle[r]).abs().max() < 0.012  # 4+ standard errors at these counts


def test_temperature_zero_is_refused():
    with pytest.raises(ValueError, match="temperature > 0"):
        draw(torch.zeros(1, 4), 0.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        DrawnToken(0.0)


def test_generate_with_drawn_token_equals_a_token_by_token_sampling_loop(tiny_toy_target):
    """Oracle: the target run one token at a time without a cache, each token drawn by `draw` from the same
    seed; `generate(do_sample=False)` with `DrawnToken` must take the same tokens."""
    from draftsmith.models.target import FrozenTarget, TargetConfig

    model = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target))).model
    model.generation_config = GenerationConfig()  # no stop token, no processor but DrawnToken
    prompt = torch.tensor([[5, 17, 33, 2, 9], [7, 7, 40, 12, 3]])
    torch.manual_seed(123)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=10,
            do_sample=False,
            logits_processor=LogitsProcessorList([DrawnToken(1.2, 0.9)]),
            pad_token_id=0,
        )
    torch.manual_seed(123)
    ids = prompt
    with torch.no_grad():
        for _ in range(10):
            logits = model(ids).logits[:, -1].float()
            ids = torch.cat([ids, draw(logits, 1.2, 0.9)[:, None]], dim=1)
    assert torch.equal(out, ids)
    assert len(set(out[:, 5:].flatten().tolist())) > 2  # it sampled: not one greedy token repeated


def test_a_batch_of_only_wide_rows_falls_back_whole():
    """Every row's nucleus wider than the candidates (flat rows): the first pass draws nothing, the fallback all."""
    logits = torch.full((3, 100), -50.0)
    logits[:, :60] = 0.0
    tokens = draw(logits, 1.0, 0.95, generator=torch.Generator().manual_seed(0), width=8)
    assert tokens.shape == (3,) and (tokens < 60).all()
    assert not nucleus(logits, 1.0, 0.95, 0, width=8)[2].any()
