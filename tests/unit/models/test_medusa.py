import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.losses import medusa_loss, medusa_token_counts
from draftsmith.models.medusa import MedusaConfig, MedusaHeads, ResBlock


def test_blocks_do_not_share_weights():
    H, V, K, n = 8, 20, 3, 2
    heads = MedusaHeads(MedusaConfig(num_heads=K, num_layers=n), H, V)
    # The reference code's `[ResBlock(H)] * n` would give K * (H*H + H + H*V): one block per head.
    assert sum(p.numel() for p in heads.parameters()) == K * (n * (H * H + H) + H * V)
    blocks = [m for m in heads.modules() if isinstance(m, ResBlock)]
    assert len({id(b.linear.weight) for b in blocks}) == K * n
    assert len({b.linear.weight.data_ptr() for b in blocks}) == K * n


def test_resblock_starts_as_identity_plus_silu_bias():
    block = ResBlock(6)
    x = torch.randn(3, 6)
    torch.testing.assert_close(block(x), x + F.silu(block.linear.bias).expand_as(x))


def test_init_from_lm_head_copies_not_aliases():
    lm = torch.randn(20, 8)
    heads = MedusaHeads(MedusaConfig(num_heads=2), 8, 20)
    heads.init_from_lm_head(lm)
    last = [h[-1] for h in heads.heads if isinstance(h, torch.nn.Sequential)]
    out = [lin.weight for lin in last if isinstance(lin, torch.nn.Linear)]
    assert len(out) == 2
    for w in out:
        torch.testing.assert_close(w, lm)
        assert w.data_ptr() != lm.data_ptr()
    out[0].data.add_(1.0)
    torch.testing.assert_close(out[1], lm)
    with pytest.raises(ValueError, match="expected"):
        heads.init_from_lm_head(torch.randn(8, 20))


def test_loss_weights():
    torch.testing.assert_close(MedusaConfig(num_heads=3).loss_weights(), torch.tensor([0.8, 0.64, 0.512]))
    torch.testing.assert_close(
        MedusaConfig(num_heads=2, head_weights=[1.0, 0.5]).loss_weights(), torch.tensor([1.0, 0.5])
    )
    with pytest.raises(ValueError, match="head_weights"):
        MedusaConfig(num_heads=3, head_weights=[1.0])


def reference_medusa(logits, ids, mask):
    """Slow oracle: loop over every (head, row, column) and apply the index rule of ALGORITHMS.md 1.3."""
    K, B, T, V = logits.shape
    sums = torch.zeros(K)
    counts = torch.zeros(K)
    top1 = torch.zeros(K)
    for k in range(1, K + 1):  # head k at column t predicts x_{t+k+1}
        for b in range(B):
            for t in range(T):
                j = t + k + 1
                if j < T and mask[b, j]:
                    sums[k - 1] += -torch.log_softmax(logits[k - 1, b, t], -1)[ids[b, j]]
                    counts[k - 1] += 1
                    top1[k - 1] += float(logits[k - 1, b, t].argmax() == ids[b, j])
    return sums, counts, top1


def test_medusa_loss_matches_slow_reference():
    g = torch.Generator().manual_seed(0)
    K, B, T, V = 3, 2, 9, 11
    logits = torch.randn(K, B, T, V, generator=g)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    sums, counts, metrics = medusa_loss(logits, ids, mask)
    ref_sums, ref_counts, ref_top1 = reference_medusa(logits, ids, mask)
    torch.testing.assert_close(sums, ref_sums)
    torch.testing.assert_close(counts, ref_counts)
    torch.testing.assert_close(metrics["top1"], ref_top1)
    torch.testing.assert_close(medusa_token_counts(mask, K), ref_counts)
    assert bool((metrics["top5"] >= metrics["top1"]).all())


def test_a_head_that_knows_the_future_has_zero_loss():
    # Logits that put all mass on the right token give ~0 loss and 100% accuracy for every head.
    K, B, T, V = 2, 1, 6, 7
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    logits = torch.full((K, B, T, V), -1e4)
    for k in range(1, K + 1):
        for t in range(T - k - 1):
            logits[k - 1, 0, t, ids[0, t + k + 1]] = 1e4
    sums, counts, metrics = medusa_loss(logits, ids, torch.ones(B, T, dtype=torch.bool))
    torch.testing.assert_close(counts, torch.tensor([4.0, 3.0]))
    assert float(sums.abs().max()) < 1e-3
    torch.testing.assert_close(metrics["top1"], counts)
