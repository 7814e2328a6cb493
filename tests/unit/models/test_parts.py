"""models/parts.py: the KV-cache keyword of transformers modules."""

from __future__ import annotations

import warnings

import torch
from conftest import make_tiny_llama
from torch import nn
from transformers import DynamicCache

from draftsmith.models.parts import with_cache


class _Before524(nn.Module):
    def forward(self, x: torch.Tensor, past_key_values: object = None) -> torch.Tensor:
        return x


class _From524(nn.Module):
    def forward(self, x: torch.Tensor, cache: object = None) -> torch.Tensor:
        return x


def test_with_cache_uses_the_keyword_the_module_takes():
    assert with_cache(_Before524(), "c") == {"past_key_values": "c"}
    assert with_cache(_From524(), "c") == {"cache": "c"}


def test_incremental_decoding_through_with_cache_is_exact_and_silent():
    """Prefix, then one token at a time through the cache: the logits of one full forward, and no warning
    (transformers 5.24+ warns on `past_key_values`)."""
    model = make_tiny_llama(61, layers=2).eval()
    config = model.config
    ids = torch.randint(0, 61, (1, 9))
    full = model(ids).logits
    cache = DynamicCache(config=config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps = [model(ids[:, :5], **with_cache(model, cache), use_cache=True).logits]
        for t in range(5, 9):
            steps.append(model(ids[:, t : t + 1], **with_cache(model, cache), use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == 9
