"""DFlash in the decoding loop (docs/ALGORITHMS-BLOCK.md 1.4 and oracles 4, 5): lossless at T=0 for chains and
static trees, a perfect draft accepts every slot, the draft cache holds exactly the committed context after
every step, and at T=1 the first tokens follow the target's distribution (chi-square)."""

from __future__ import annotations

import types

import pytest
import torch
from _chi2 import chi_square_pvalue
from test_lossless_sampling import PROMPT, RUNS, V, exact_joint, sharp_llama

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import prompt_turns, read_conversations
from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.drafters.dflash import DFlashDrafter
from draftsmith.eval.kv_cache import seq_length
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.dflash import DFlashConfig, DFlashDraft
from draftsmith.models.target import FrozenTarget, TargetConfig

MAX_NEW = 24


@pytest.fixture(scope="module")
def target(tiny_toy_target):
    return FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))


@pytest.fixture(scope="module")
def prompts(target):
    convs = read_conversations("stdlib:heldout", limit=3)
    return [render_prompt(target.tokenizer, prompt_turns(c)[-1]) for c in convs]


def dflash(target_model, block: int = 5, taps: list[int] | None = None, mask: int = 0) -> DFlashDrafter:
    torch.manual_seed(0)  # untrained: losslessness must not depend on the draft's quality
    L = target_model.config.num_hidden_layers
    draft = DFlashDraft(
        DFlashConfig(block_size=block, num_layers=2, feature_layers=taps or [1, L - 1], mask_token_id=mask),
        target_model.config,
        target_model.config.vocab_size,
    )
    draft.attach_target(target_model.get_input_embeddings(), target_model.get_output_embeddings())
    return DFlashDrafter(draft)


class CacheWatch:
    """Wraps the drafter: after every proposal the draft cache holds exactly the committed context rows."""

    def __init__(self, inner: DFlashDrafter):
        self.inner = inner
        self.name, self.feature_layers, self.max_depth = inner.name, inner.feature_layers, inner.max_depth
        self.lengths: list[tuple[int, int]] = []

    def start(self) -> None:
        self.inner.start()

    def observe(self, features):
        self.inner.observe(features)

    def propose(self, context, shape, sampling, generator):
        tree = self.inner.propose(context, shape, sampling, generator)
        if shape.depth:  # a depth-0 step (the last token of a generation) runs no draft pass
            self.lengths.append((seq_length(self.inner.cache), len(context) - 1))
        return tree


@pytest.mark.parametrize("tree", ["chain", "topk:2"])
def test_greedy_speculative_output_equals_greedy_decoding(target, prompts, tree):
    watch = CacheWatch(dflash(target.model))
    decoder = SpeculativeDecoder(target, watch, parse_tree(tree, 4), Sampling())
    for prompt in prompts:
        out = decoder.generate(prompt, MAX_NEW)
        ref = target.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW)
        assert out.tokens == ref[0, len(prompt) :].tolist()
    assert watch.lengths and all(cache == committed for cache, committed in watch.lengths)


def test_a_perfect_draft_accepts_every_slot(target, prompts, monkeypatch):
    """Slots replaced by the target's own greedy continuation: every step accepts B-1 drafts, B tokens per
    target forward, and the output is still plain greedy decoding."""
    drafter = dflash(target.model, block=5)

    def perfect(self, context, slots):
        run = target.model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=slots)
        logits = torch.full((slots, target.vocab_size), -10.0)
        logits[torch.arange(slots), run[0, len(context) :]] = 10.0
        return logits

    monkeypatch.setattr(DFlashDrafter, "slot_logits", perfect)
    decoder = SpeculativeDecoder(target, drafter, parse_tree("chain", 4), Sampling())
    for prompt in prompts:
        out = decoder.generate(prompt, 1 + 5 * 4)
        ref = target.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=1 + 5 * 4)
        assert out.tokens == ref[0, len(prompt) :].tolist()
        full = out.steps if out.stop == "length" else out.steps[:-1]  # a stop token may cut the last step
        assert full and all(s.accepted == 4 and s.committed == 5 for s in full)


def test_trees_deeper_than_the_block_and_dynamic_trees_are_refused(target):
    drafter = dflash(target.model, block=4)
    with pytest.raises(ValueError, match="at most 3 tokens ahead.*lower --depth to 3"):
        SpeculativeDecoder(target, drafter, parse_tree("chain", 5), Sampling()).generate([1, 2, 3], 4)
    with pytest.raises(ValueError, match="dynamic"):
        SpeculativeDecoder(target, drafter, parse_tree("dynamic:2:4", 3), Sampling()).generate([1, 2, 3], 4)


def test_first_tokens_follow_the_target_distribution_at_t1():
    target_model = sharp_llama(seed=0, scale=8.0)
    target = FrozenTarget(target_model, types.SimpleNamespace(eos_token_id=None), "tiny-v5")
    decoder = SpeculativeDecoder(
        target,
        dflash(target_model, block=3, taps=[1, 2], mask=4),
        parse_tree("chain", 2),
        Sampling(temperature=1.0),
    )
    counts = torch.zeros(V, V, V)
    rejected_at_1 = 0
    for seed in range(RUNS):
        out = decoder.generate(PROMPT, 4, torch.Generator().manual_seed(seed))
        counts[tuple(out.tokens[:3])] += 1
        rejected_at_1 += out.steps[0].accepted == 0
    assert 0.1 * RUNS < rejected_at_1 < 0.9 * RUNS  # a poor draft, sometimes right
    assert chi_square_pvalue(counts, exact_joint(target_model, PROMPT, Sampling(temperature=1.0))) > 1e-3
