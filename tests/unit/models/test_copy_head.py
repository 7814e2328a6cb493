"""`draft.layer_init: copy`: the untrained head copies as a one-token lookup does where the features say which
token each position holds, and only its own group's weights (and fc's later taps) change."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama

from draftsmith.models.copy_head import (
    copy_head_slices,
    freeze_copy_head,
    init_copy_head,
    ridge_read,
    stable_dims,
)
from draftsmith.models.draft_layer import draft_layer_settings
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft

V, H = 40, 64


def _features(emb: torch.Tensor, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Three taps: the first says the token (its embedding, scaled, plus a little noise); the later two are
    noise five times larger, as a pretrained target's later taps dwarf its early one."""
    first = 3 * emb[ids] / emb[ids].norm(dim=-1, keepdim=True) * H**0.5
    first = first + 0.1 * torch.randn(len(ids), H, generator=gen)
    return torch.cat([first, 5 * torch.randn(len(ids), 2 * H, generator=gen)], -1)


def _draft(llama) -> Eagle3Draft:
    torch.manual_seed(0)
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3]), llama.config, V).eval()
    draft.attach_target(llama.get_input_embeddings(), llama.get_output_embeddings())
    with torch.no_grad():  # a tied target's head behind `draft.head_init: target`
        draft.lm_head_d.weight.copy_(llama.get_input_embeddings().weight)
    return draft


def _copied(draft: Eagle3Draft, emb: torch.Tensor, gen: torch.Generator) -> int:
    """Of the 19 columns after a 20-token block is repeated, how many predict (step 0) the token that followed
    their query's token in the block: a one-token lookup's prediction, right at every one of them."""
    block = torch.randperm(V, generator=gen)[:20]
    ids = torch.cat([block, block])
    with torch.no_grad():
        hidden = draft.unroll_hidden(_features(emb, ids, gen)[None], ids[None])[0]
        predicted = draft.to_target_ids(draft.logits(hidden).argmax(-1))[0]
    return sum(int(predicted[t] == ids[t + 2]) for t in range(19, 38))


def test_an_untrained_copy_head_copies_a_repeated_block() -> None:
    llama = make_tiny_llama(V, layers=4, hidden=H)
    emb = llama.get_input_embeddings().weight.detach()
    gen = torch.Generator().manual_seed(0)
    fit_ids = torch.randint(0, V, (1200,), generator=gen)
    fit_features = _features(emb, fit_ids, gen)
    draft = _draft(llama)
    before = {name: p.detach().clone() for name, p in draft.named_parameters()}
    plain = sum(_copied(draft, emb, torch.Generator().manual_seed(s)) for s in range(5))
    init_copy_head(draft, draft_layer_settings(llama.config), emb, fit_features, fit_ids, span=40)
    copied = sum(_copied(draft, emb, torch.Generator().manual_seed(s)) for s in range(5))
    assert plain <= 10 and copied >= 60, (plain, copied)  # of 95 columns (71 here); chance is 95 / 40
    changed = {name for name, p in draft.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {f"layer.self_attn.{n}_proj.weight" for n in "qkvo"} | {"fc.weight"}
    hd, group = 16, 2  # 4 heads over 2 kv heads
    for name, rows in (("q", slice(group * hd, None)), ("k", slice(hd, None)), ("v", slice(hd, None))):
        weight = draft.get_parameter(f"layer.self_attn.{name}_proj.weight")
        assert torch.equal(weight[rows], before[f"layer.self_attn.{name}_proj.weight"][rows])
    o = draft.get_parameter("layer.self_attn.o_proj.weight")
    assert torch.equal(o[:, group * hd :], before["layer.self_attn.o_proj.weight"][:, group * hd :])
    assert torch.equal(draft.fc.weight[:, :H], before["fc.weight"][:, :H])  # the first tap's columns stay


def test_stable_dimensions_are_the_pairs_that_turn_little_over_the_span() -> None:
    # head_dim 4, theta 100: frequencies 1 and 0.1; over 4 positions they turn 4 and 0.4 radians
    assert stable_dims(4, theta=100.0, span=4).tolist() == [False, True, False, True]
    assert stable_dims(4, theta=100.0, span=6).tolist() == [False] * 4


def test_the_ridge_read_recovers_an_exact_linear_map_at_any_column_scale() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 5, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 1e3, 1e-2, 5.0, 1.0])
    truth = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    read = ridge_read(x.T @ x, x.T @ (x @ truth), len(x), ridge=1e-12)
    assert torch.allclose(read, truth, atol=1e-6)


def test_the_copy_init_is_eagle3s() -> None:
    with pytest.raises(ValueError, match="layer_init"):
        EagleConfig(version=1, layer_init="copy")


@pytest.mark.parametrize("whole_fc", [False, True])
def test_a_frozen_copy_head_stays_as_built_while_the_rest_trains(whole_fc: bool) -> None:
    llama = make_tiny_llama(V, layers=4, hidden=H)
    emb = llama.get_input_embeddings().weight.detach()
    gen = torch.Generator().manual_seed(0)
    fit_ids = torch.randint(0, V, (1200,), generator=gen)
    draft = _draft(llama).train()
    settings = draft_layer_settings(llama.config)
    init_copy_head(draft, settings, emb, _features(emb, fit_ids, gen), fit_ids, span=40)
    freeze_copy_head(draft, settings, whole_fc)
    built = {name: p.detach().clone() for name, p in draft.named_parameters()}
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        ids = torch.randint(0, V, (2, 24), generator=gen)
        hidden = draft.unroll_hidden(_features(emb, ids.flatten(), gen).view(2, 24, -1), ids)[0]
        draft.logits(hidden).logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    slices = copy_head_slices(draft, settings, whole_fc)
    assert set(slices) == {f"layer.self_attn.{n}_proj.weight" for n in "qkvo"} | {"fc.weight"}
    for name, (rows, cols) in slices.items():
        now, before = draft.get_parameter(name).detach(), built[name]
        assert torch.equal(now[rows, cols], before[rows, cols]), name
        rest = torch.ones_like(now, dtype=torch.bool)
        rest[rows, cols] = False
        if rest.any():  # with whole_fc, fc has no rest
            assert not torch.equal(now[rest], before[rest]), name  # the rest of each weight trains
    assert whole_fc == torch.equal(draft.fc.weight, built["fc.weight"])
    assert not torch.equal(
        draft.get_parameter("layer.mlp.down_proj.weight"), built["layer.mlp.down_proj.weight"]
    )


def test_freezing_the_copy_head_needs_one() -> None:
    with pytest.raises(ValueError, match="freeze_copy_head"):
        EagleConfig(freeze_copy_head="head")
    with pytest.raises(ValueError, match="'off', 'head' or 'head_and_fc'"):
        EagleConfig(layer_init="copy", freeze_copy_head="yes")  # type: ignore[arg-type]
    EagleConfig(layer_init="copy", freeze_copy_head="head_and_fc")
