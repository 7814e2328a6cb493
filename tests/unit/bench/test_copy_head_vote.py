"""bench.copy_head_vote reads kv group 0's attention: an untrained copy head's vote copies a repeated block
where a one-token lookup does, a random group's does not, and the later-tap swap touches only those columns."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama

from bench.copy_ceiling import lookup_predictions
from bench.copy_head_vote import group_attention, head_and_drafter, with_built_taps
from draftsmith.models.copy_head import init_copy_head
from draftsmith.models.draft_layer import draft_layer_settings
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft

V, H = 40, 64


def _features(emb: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    first = 3 * emb[ids] / emb[ids].norm(dim=-1, keepdim=True) * H**0.5 + 0.1 * torch.randn(
        len(ids), H, generator=gen
    )
    return torch.cat([first, 5 * torch.randn(len(ids), 2 * H, generator=gen)], -1)


def _draft(llama, copy: bool) -> Eagle3Draft:
    torch.manual_seed(0)
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3]), llama.config, V).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    if copy:
        emb = llama.get_input_embeddings().weight.detach()
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, V, (1200,), generator=gen)
        init_copy_head(draft, draft_layer_settings(llama.config), emb, _features(emb, ids, gen), ids, span=40)
    return draft


def _votes_like_the_lookup(draft: Eagle3Draft, emb: torch.Tensor) -> int:
    hits = 0
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        block = torch.randperm(V, generator=gen)[:20]
        ids = torch.cat([block, block])
        weights = group_attention(draft, _features(emb, ids, gen)[None], ids[None])
        assert torch.allclose(weights.sum(-1), torch.ones(len(ids)))  # each row a distribution
        assert (weights.triu(1) == 0).all()  # causal
        head, _ = head_and_drafter(draft, _features(emb, ids, gen)[None], ids[None], V)
        expected = lookup_predictions(ids)
        hits += int(((head == expected) & (expected >= 0))[19:38].sum())
    return hits


def test_the_vote_of_a_built_copy_head_copies_and_a_random_groups_does_not() -> None:
    llama = make_tiny_llama(V, layers=4, hidden=H)
    emb = llama.get_input_embeddings().weight.detach()
    copied, plain = (
        _votes_like_the_lookup(_draft(llama, True), emb),
        _votes_like_the_lookup(_draft(llama, False), emb),
    )
    assert copied >= 70 and plain <= 15, (copied, plain)  # of 95 columns (79 here); chance is about 95 / 20


def test_the_later_tap_swap_changes_only_those_columns() -> None:
    llama = make_tiny_llama(V, layers=4, hidden=H)
    built, other = _draft(llama, True), _draft(llama, False)
    swapped = with_built_taps(other, built)
    assert torch.equal(swapped.fc.weight[:, H:], built.fc.weight[:, H:])
    assert torch.equal(swapped.fc.weight[:, :H], other.fc.weight[:, :H])
    assert not torch.equal(other.fc.weight[:, H:], built.fc.weight[:, H:])  # the original is untouched
