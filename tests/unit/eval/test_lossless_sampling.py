"""At T=1 with a deliberately poor drafter, speculative decoding samples exactly the target's distribution.

Small-vocabulary random Llamas (V=5, logits sharpened so the distributions are far from uniform and far from
each other): the joint distribution of the first 3 generated tokens (the prefill token and the tokens of the
first depth-2 verification) over many seeds is compared with the target's exact distribution, computed by
enumerating every prefix, with a chi-square test: a sampled chain (Leviathan rule), a deterministic top-2
tree (point-mass rule), a tree of 2 sampled children per depth (SpecInfer rule), an EAGLE-3 dynamic tree
(point-mass rule on the draft's top-ranked candidates), and EAGLE-3 chains and trees sampled from its reduced
vocabulary (vLLM's `probabilistic` drafts: q is zero outside the draft vocabulary). The verification rules' own negative control (a biased
rule is caught by the same statistic) is in test_verify.py.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _chi2 import chi_square_pvalue
from conftest import make_tiny_llama

from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.drafters import EagleDrafter, LMDrafter
from draftsmith.eval.drafters.base import Drafter
from draftsmith.eval.drafters.peagle import PEagleDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.models.peagle import PEagleConfig, PEagleDraft
from draftsmith.models.target import FrozenTarget

V = 5
PROMPT = [1, 3, 0, 2]
RUNS = 3000


def sharp_llama(seed: int, scale: float):
    model = make_tiny_llama(V, layers=2, hidden=32, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.generation_config.eos_token_id = None
    return model


@torch.no_grad()
def exact_joint(model, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """P(t1, t2, t3 | prompt) `[V, V, V]` by enumerating every prefix."""
    p1 = sampling.probs(model(torch.tensor([prompt])).logits[0, -1])
    firsts = torch.tensor([prompt + [a] for a in range(V)])
    p2 = sampling.probs(model(firsts).logits[:, -1])  # [V, V]
    seconds = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
    p3 = sampling.probs(model(seconds).logits[:, -1]).reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def eagle3_drafter(target_model) -> EagleDrafter:
    torch.manual_seed(2)
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[0, 1, 2]), target_model.config, V)
    draft.attach_target(target_model.get_input_embeddings(), target_model.get_output_embeddings())
    return EagleDrafter(draft)


def pruned_eagle3_drafter(target_model) -> EagleDrafter:
    """EAGLE-3 drafting 4 of the 5 tokens (token 3 is outside its vocabulary, so q(3) = 0)."""
    torch.manual_seed(2)
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=[0, 1, 2], draft_vocab_size=4), target_model.config, 4
    )
    draft.set_vocab_map(*build_vocab_map(torch.tensor([9, 8, 7, 0, 6]), 4))
    draft.attach_target(target_model.get_input_embeddings(), target_model.get_output_embeddings())
    return EagleDrafter(draft)


def peagle_drafter(target_model) -> PEagleDrafter:
    """Untrained; the mask id 1 is also a real token of the V=5 vocabulary, so outputs equal it often. Seed 2: its
    first draft is accepted about a quarter of the time."""
    torch.manual_seed(2)
    cfg = PEagleConfig(
        feature_layers=[0, 1, 2], num_layers=2, num_depths=2, mask_token_id=1, mask_embedding="learned"
    )
    draft = PEagleDraft(cfg, target_model.config, V)
    draft.attach_target(target_model.get_input_embeddings(), target_model.get_output_embeddings())
    return PEagleDrafter(draft)


@pytest.mark.parametrize(
    ("drafter", "tree", "sampling"),
    [
        ("lm", "chain", Sampling(temperature=1.0)),
        ("lm", "topk:2", Sampling(temperature=0.8, top_p=0.9)),
        ("lm", "sample:2", Sampling(temperature=1.0, top_k=4)),
        ("eagle3", "dynamic:2:4", Sampling(temperature=1.0)),
        ("eagle3-pruned", "sample:1", Sampling(temperature=1.0)),
        ("eagle3-pruned", "sample:2", Sampling(temperature=0.8, top_k=4)),
        ("peagle", "chain", Sampling(temperature=1.0)),
    ],
    ids=[
        "chain-T1",
        "topk2-T0.8-topp0.9",
        "sample2-T1-topk4",
        "eagle3-dynamic-T1",
        "eagle3-probabilistic-chain-T1",
        "eagle3-sample2-T0.8-topk4",
        "peagle-chain-T1",
    ],
)
def test_first_tokens_follow_the_target_distribution(drafter, tree, sampling):
    target_model = sharp_llama(seed=0, scale=8.0)
    target = FrozenTarget(target_model, types.SimpleNamespace(eos_token_id=None), "tiny-v5")
    # unrelated / untrained models: poor drafters
    builders: dict[str, Callable[[Any], Drafter]] = {
        "lm": lambda m: LMDrafter(sharp_llama(seed=1, scale=8.0)),
        "eagle3": eagle3_drafter,
        "eagle3-pruned": pruned_eagle3_drafter,
        "peagle": peagle_drafter,
    }
    draft = builders[drafter](target_model)
    decoder = SpeculativeDecoder(target, draft, parse_tree(tree, 2), sampling)
    counts = torch.zeros(V, V, V)
    rejected_at_1 = 0
    for seed in range(RUNS):
        out = decoder.generate(PROMPT, 4, torch.Generator().manual_seed(seed))
        counts[tuple(out.tokens[:3])] += 1
        rejected_at_1 += out.steps[0].accepted == 0
    expected = exact_joint(target_model, PROMPT, sampling)
    assert 0.1 * RUNS < rejected_at_1 < 0.9 * RUNS  # the draft really is poor, and sometimes right
    assert chi_square_pvalue(counts, expected) > 1e-3
