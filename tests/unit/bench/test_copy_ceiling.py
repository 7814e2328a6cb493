"""The copy ceiling's parts against hand-computed cases: the one-token lookup, the copy head's vote and readout,
the token map's fit, and the rotary embedding."""

import math

import torch

from bench.copy_ceiling import (
    KeySpace,
    copy_weights,
    fit_token_map,
    lookup_predictions,
    measure_sample,
    readout,
    rotate,
    vote,
)

IDS = torch.tensor([5, 6, 7, 5, 6, 9, 5])


def test_lookup_predicts_the_token_after_the_last_earlier_occurrence() -> None:
    # column t: ids[t+1]'s last occurrence at a position <= t, then the token after it
    assert lookup_predictions(IDS).tolist() == [-1, -1, 6, 7, -1, 6, -1]


def test_a_sharp_head_on_exact_keys_votes_as_the_lookup_where_the_match_is_unique() -> None:
    emb = torch.eye(10)
    queries = torch.cat([emb[IDS[1:]], torch.zeros(1, 10)])
    predicted = vote(copy_weights(emb[IDS], queries, sharpness=50.0), IDS, vocab=10)
    expected = lookup_predictions(IDS)
    found = expected >= 0
    assert predicted[found].tolist() == expected[found].tolist()
    assert predicted[-1] == -1
    # two earlier 5s followed by 6 and 6: the vote's weight is theirs, not spread over other tokens
    weights = copy_weights(emb[IDS], queries, sharpness=50.0)
    assert math.isclose(float(weights[5, [0, 3]].sum()), 1.0, rel_tol=1e-6)


def test_the_readout_through_orthonormal_values_and_head_equals_the_vote() -> None:
    emb = torch.eye(10)
    queries = torch.cat([emb[IDS[1:]], torch.zeros(1, 10)])
    weights = copy_weights(emb[IDS], queries, sharpness=50.0)
    predicted = readout(weights, IDS, values=emb, head=emb)
    found = lookup_predictions(IDS) >= 0
    assert predicted[found].tolist() == vote(weights, IDS, 10)[found].tolist()


def test_the_token_map_recovers_an_exact_linear_read_of_the_embedding() -> None:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(12, 4, generator=g)
    mix = torch.randn(4, 6, generator=g) * torch.tensor([1.0, 1e3, 1.0, 1e-2, 5.0, 1.0])  # uneven scales
    ids = torch.randint(0, 12, (300,), generator=g)
    features = (emb[ids] - emb.mean(0)) @ mix
    token_map = fit_token_map(
        iter([(features[:150], ids[:150]), (features[150:], ids[150:])]), emb, ridge=1e-12
    )
    assert torch.allclose(features @ token_map, emb[ids] - emb.mean(0), atol=1e-4)


def test_rotary_embedding_by_hand_and_relative() -> None:
    # D = 2: one pair at frequency theta^0 = 1, so position p turns the vector by p radians
    turned = rotate(torch.tensor([[1.0, 0.0]]), torch.tensor([1]), theta=100.0)
    assert torch.allclose(turned, torch.tensor([[math.cos(1.0), math.sin(1.0)]]), atol=1e-6)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 8, generator=g), torch.randn(1, 8, generator=g)
    base = (rotate(q, torch.tensor([9]), 1e4) * rotate(k, torch.tensor([4]), 1e4)).sum()
    shifted = (rotate(q, torch.tensor([109]), 1e4) * rotate(k, torch.tensor([104]), 1e4)).sum()
    assert torch.allclose(base, shifted, atol=1e-5)  # only the distance counts


def test_keys_read_exactly_from_the_features_copy_as_the_tokens_own_embedding_does() -> None:
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(10, 6, generator=g)
    mix = torch.randn(6, 6, generator=g)
    ids = IDS.repeat(3)
    item = {
        "input_ids": ids,
        "top1": torch.roll(ids, -1),
        "loss_mask": torch.ones(len(ids), dtype=torch.bool),
    }
    features = (emb[ids] - emb.mean(0)) @ mix
    space = KeySpace(emb, emb, torch.linalg.inv(mix), torch.eye(6), torch.eye(6), theta=1e4)
    counts = measure_sample(item, features, space)
    for positions in ("none", "rope", "stable"):
        assert counts[f"features / {positions} / vote"] == counts[f"token / {positions} / vote"]
    hits, total = counts["lookup (one token)"]
    lookup, top1 = lookup_predictions(ids).tolist(), item["top1"].tolist()
    assert total == len(ids) - 1 and hits == sum(int(lookup[t] == top1[t + 1]) for t in range(len(ids) - 1))
    assert hits > 0
