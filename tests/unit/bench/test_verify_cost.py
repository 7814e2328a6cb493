"""bench/verify_cost.py: the MKL-packed linear layers compute what the model's own do, and are undone."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama
from torch import nn

from bench.verify_cost import pack_linears, verify_ms

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")


@torch.no_grad()
def test_packed_linears_give_the_models_logits_and_restore_its_forward():
    model = make_tiny_llama(64, layers=2).eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits
    restore = pack_linears(model, rows=6)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all("forward" in vars(m) for m in linears)
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)  # the packed rows
    other = ids[:, :4]  # a row count that was not packed falls back to the plain product
    torch.testing.assert_close(model(other).logits, want[:, :4], rtol=1e-5, atol=1e-5)
    assert restore() > 0
    assert not any("forward" in vars(m) for m in linears)
    assert torch.equal(model(ids).logits, want)
    assert verify_ms(model, ids, 2, repeats=1) > 0
