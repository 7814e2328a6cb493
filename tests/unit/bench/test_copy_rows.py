"""bench.copy_rows: per TTT step, the copy rows are the columns with a step-0 source for that step's query and
label (a slow loop's count), step 0 agrees with the first-step count, and the rows a chain reaches shrink."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama

from bench.copy_rows import count_rows, count_step_rows
from draftsmith.models.copy_head import init_copy_head
from draftsmith.models.draft_layer import draft_layer_settings
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.train.eagle import step_masks
from draftsmith.train.eagle_chunks import data_labels

V, H, STEPS = 40, 64, 3


def _features(emb: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    first = 3 * emb[ids] / emb[ids].norm(dim=-1, keepdim=True) * H**0.5 + 0.1 * torch.randn(
        len(ids), H, generator=gen
    )
    return torch.cat([first, 5 * torch.randn(len(ids), 2 * H, generator=gen)], -1)


def _slow_copy_rows(ids: list[int], step: int, counted: torch.Tensor) -> int:
    """Columns t (counted) with some j <= t where x_j = x_{t+step+1} and x_{j+1} = x_{t+step+2}."""
    n = 0
    for t in range(len(ids) - step - 2):
        query, label = ids[t + step + 1], ids[t + step + 2]
        n += bool(counted[t]) and any(ids[j] == query and ids[j + 1] == label for j in range(t + 1))
    return n


def test_step_rows_count_the_sources_each_step_reads() -> None:
    llama = make_tiny_llama(V, layers=4, hidden=H)
    emb = llama.get_input_embeddings().weight.detach()
    torch.manual_seed(0)
    cfg = EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=STEPS)
    draft = Eagle3Draft(cfg, llama.config, V).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    gen = torch.Generator().manual_seed(0)
    fit = torch.randint(0, V, (1200,), generator=gen)
    init_copy_head(draft, draft_layer_settings(llama.config), emb, _features(emb, fit, gen), fit, span=60)
    block = torch.randperm(V, generator=gen)[:15]
    ids = torch.cat([torch.randint(0, V, (8,), generator=gen), block, block, block[:7]])
    features = _features(emb, ids, gen)[None]
    loss_mask = torch.ones(1, len(ids), dtype=torch.long)
    loss_mask[0, :5] = 0
    batch = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids[None]), "loss_mask": loss_mask}
    got = count_step_rows(draft, features, ids[None], batch)
    assert got.shape == (STEPS, 2, 5)
    for s, masked in enumerate(step_masks(batch, STEPS)):
        counted = masked[0] & (data_labels(batch, s)[0] >= 0)
        assert int(got[s, 0, 0]) == _slow_copy_rows(ids.tolist(), s, counted) > 0
        assert int(got[s, 0, 0] + got[s, 0, 3]) == int(counted.sum())  # copy rows and others: every column
        assert (got[s, 1] <= got[s, 0]).all()  # a chain reaches a subset
        assert (got[s, :, 1] <= got[s, :, 0]).all() and (got[s, :, 2] <= got[s, :, 0]).all()
    assert torch.equal(got[0, 0], got[0, 1])  # every column reaches the first step
    first = step_masks(batch, 1)[0][0] & (data_labels(batch, 0)[0] >= 0)
    assert got[0, 0].tolist() == count_rows(draft, features, ids[None], first)
    assert int(got[1, 0, 2]) >= int(got[1, 0, 0]) // 2  # the built head finds the block at later steps too
