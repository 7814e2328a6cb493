"""The decoding loop on a trained toy target: lossless at T=0 for every drafter and tree, exact bookkeeping."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import prompt_turns, read_conversations
from draftsmith.eval.decoder import SpeculativeDecoder, plain_decode
from draftsmith.eval.drafters import EagleDrafter, LMDrafter, MedusaDrafter, MTPDrafter, NgramDrafter
from draftsmith.eval.drafters.peagle import PEagleDrafter
from draftsmith.eval.report import TurnResult, summarize
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.draft_lm import draft_from_target
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.mtp import MTPConfig, MTPDraft
from draftsmith.models.peagle import PEagleConfig, PEagleDraft
from draftsmith.models.target import FrozenTarget, TargetConfig

MAX_NEW = 24


@pytest.fixture(scope="module")
def target(tiny_toy_target):
    return FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))


@pytest.fixture(scope="module")
def prompts(target):
    convs = read_conversations("stdlib:heldout", limit=3)
    return [render_prompt(target.tokenizer, prompt_turns(c)[-1]) for c in convs]


def make_drafter(kind: str, target: FrozenTarget):
    if kind == "ngram":
        return NgramDrafter()
    if kind == "medusa":
        torch.manual_seed(0)
        heads = MedusaHeads(MedusaConfig(num_heads=3), target.hidden_size, target.vocab_size)
        heads.init_from_lm_head(target.lm_head.weight)
        return MedusaDrafter(heads.eval())
    if kind == "draft_lm":
        return LMDrafter(draft_from_target(target.model, 1))
    if kind in ("eagle", "eagle3", "eagle3_two_layers"):  # untrained: lossless whatever the draft's quality
        torch.manual_seed(0)
        cls = Eagle1Draft if kind == "eagle" else Eagle3Draft
        cfg = (
            EagleConfig(version=1) if kind == "eagle" else EagleConfig(num_layers=1 + kind.endswith("layers"))
        )
        draft = cls(cfg, target.model.config, target.vocab_size)
        draft.attach_target(target.embed_tokens, target.head)
        return EagleDrafter(draft)
    if kind == "mtp":
        torch.manual_seed(0)
        mtp = MTPDraft(MTPConfig(num_modules=3), target.model.config, target.vocab_size)
        mtp.attach_target(target.embed_tokens, target.head)
        return MTPDrafter(mtp)
    if kind == "peagle":  # untrained; mask id 0 is also a real token (the pad), embedded as itself
        torch.manual_seed(0)
        pcfg = PEagleConfig(num_layers=2, num_depths=3, mask_token_id=0, mask_embedding="learned")
        peagle = PEagleDraft(pcfg, target.model.config, target.vocab_size)
        peagle.attach_target(target.embed_tokens, target.head)
        return PEagleDrafter(peagle)
    return LMDrafter(target.model, name="self")


KINDS = ["ngram", "medusa", "draft_lm", "self", "eagle", "eagle3"]
CASES = (
    [(k, t) for k in KINDS for t in ("chain", "topk:2", "paths")]
    + [
        (k, "dynamic:3:8")
        for k in ("eagle", "eagle3")  # dynamic trees need the draft's own confidences
    ]
    + [("mtp", "chain"), ("peagle", "chain")]  # P-EAGLE drafts chains only
    + [("eagle3_two_layers", "chain"), ("eagle3_two_layers", "dynamic:3:8")]
)


@pytest.mark.parametrize(("kind", "tree"), CASES)
def test_greedy_speculative_output_equals_greedy_decoding(target, prompts, kind, tree, tmp_path):
    if tree == "paths":
        (tmp_path / "t.json").write_text(json.dumps([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2]]))
        tree = f"paths:{tmp_path / 't.json'}"
    decoder = SpeculativeDecoder(target, make_drafter(kind, target), parse_tree(tree, 3), Sampling())
    for prompt in prompts:
        out = decoder.generate(prompt, MAX_NEW)
        ref = target.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW)
        assert out.tokens == ref[0, len(prompt) :].tolist()
        assert plain_decode(target, prompt, MAX_NEW, Sampling()).tokens == out.tokens
        assert 1 + out.step_tokens == len(out.tokens)  # prefill token + every step's tokens
        for step in out.steps:
            assert step.committed <= step.accepted + 1 and step.accepted <= step.depth


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_self_drafter_accepts_everything(target, prompts, temperature):
    depth = 3
    decoder = SpeculativeDecoder(
        target, LMDrafter(target.model, "self"), parse_tree("chain", depth), Sampling(temperature)
    )
    steps = []
    for i, prompt in enumerate(prompts):
        out = decoder.generate(prompt, 1 + 6 * (depth + 1), torch.Generator().manual_seed(i))
        steps += out.steps
        if out.stop == "length":  # without an early stop every step is a full chain
            assert all(s.depth == depth for s in out.steps)
    assert all(s.accepted == s.depth for s in steps)
    full = [s for s in steps if s.depth == depth and s.committed == depth + 1]
    assert len(full) >= len(steps) - len(prompts)  # at most one cut step (a stop token) per sequence
    assert summarize([TurnResult("x", 0, 0, _gen(full))])["tau"] == depth + 1


def test_full_drafts_at_the_budget_count_acceptances_past_it_as_vllm_does(target, prompts):
    """vLLM's scheduler keeps a draft's full depth at max_tokens and counts every accepted draft token; the
    answer is cut at the budget. With the self drafter (every draft accepted) and 1 + 2 new tokens left after
    the prefill's, depth 5: shrink drafts 1 (the step's own token fills the budget), full drafts 5 and
    accepts 5; both commit the same 2 tokens."""
    depth, budget = 5, 3
    out = {}
    for rule in ("shrink", "full"):
        decoder = SpeculativeDecoder(
            target,
            LMDrafter(target.model, "self"),
            parse_tree("chain", depth),
            Sampling(),
            drafts_at_budget=rule,
        )
        out[rule] = decoder.generate(prompts[0], budget)
    shrink, full = out["shrink"], out["full"]
    assert shrink.tokens == full.tokens and len(full.tokens) == budget
    assert [(s.depth, s.accepted, s.committed) for s in shrink.steps] == [(1, 1, 2)]
    assert [(s.depth, s.accepted, s.committed) for s in full.steps] == [(depth, depth, 2)]
    with pytest.raises(ValueError, match="drafts_at_budget"):
        SpeculativeDecoder(target, NgramDrafter(), parse_tree("chain", 2), Sampling(), drafts_at_budget="x")


def _gen(steps):
    from draftsmith.eval.decoder import Generation

    return Generation(tokens=[0] * (1 + sum(s.committed for s in steps)), steps=steps)


def test_target_forwards_counted_by_a_hook_match_the_report(target, prompts):
    calls = []
    handle = target.decoder.register_forward_hook(lambda *args: calls.append(1))
    try:
        decoder = SpeculativeDecoder(target, NgramDrafter(), parse_tree("topk:2", 4), Sampling())
        turns = [TurnResult(str(i), 0, len(p), decoder.generate(p, MAX_NEW)) for i, p in enumerate(prompts)]
    finally:
        handle.remove()
    report = summarize(turns)
    assert report["target_forwards"] == len(calls)
    assert report["new_tokens"] == sum(len(t.spec.tokens) for t in turns)
    steps = [s for t in turns for s in t.spec.steps]
    assert report["tau"] == pytest.approx((report["new_tokens"] - len(turns)) / len(steps))


def test_draft_lm_accepted_counts_equal_transformers_assisted_generation(target, prompts, monkeypatch):
    """Oracle: transformers' assisted generation with the same 1-layer draft, K=3, constant schedule.

    transformers folds the prefill into its first verification, so it is started from prompt + our first
    token (greedy, hence identical): from there both loops draft from the same context at every step.
    """
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    depth = 3
    draft = draft_from_target(target.model, 1)
    cfg = draft.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = depth, "constant"
    cfg.assistant_confidence_threshold = 0.0  # no early stop of drafting
    matches: list[int] = []
    original = AssistedCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        matches.append(int(num_matches))
        return original(self, input_ids, scores, num_matches)

    monkeypatch.setattr(AssistedCandidateGenerator, "update_candidate_strategy", record)
    decoder = SpeculativeDecoder(target, LMDrafter(draft), parse_tree("chain", depth), Sampling())
    total = 0
    for prompt in prompts:
        out = decoder.generate(prompt, 40)
        matches.clear()
        hf = target.model.generate(
            torch.tensor([prompt + out.tokens[:1]]), assistant_model=draft, max_new_tokens=39, do_sample=False
        )
        assert [s.accepted for s in out.steps] == matches
        assert hf[0, len(prompt) :].tolist() == out.tokens
        total += sum(matches)
    assert total > 0  # the copied-layer draft does get tokens accepted: the comparison is not vacuous


def test_typical_acceptance_runs_through_the_loop(target, prompts):
    typical = SpeculativeDecoder(
        target, make_drafter("medusa", target), parse_tree("topk:2", 3), Sampling(), "typical"
    )
    out = typical.generate(prompts[0], MAX_NEW)
    assert 1 + out.step_tokens == len(out.tokens) <= MAX_NEW
    assert all(s.committed <= s.accepted + 1 for s in out.steps)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "eagle3_two_layers"])
def test_eagle_draft_cache_holds_only_real_pairs(target, prompts, kind):
    """After every proposal the draft's cache holds exactly one entry per committed pair (feature of
    position j, token j+1) in every layer: drafted entries never leak into the next step (the reference's
    stable_kv)."""
    drafter = make_drafter(kind, target)
    decoder = SpeculativeDecoder(target, drafter, parse_tree("dynamic:3:8", 4), Sampling())
    real_propose = drafter.propose
    seen = []

    def propose(context, *args):
        tree = real_propose(context, *args)
        lengths = {drafter.cache.get_seq_length(i) for i in range(len(drafter.cache.layers))}
        assert len(drafter.cache.layers) == drafter.draft.config.num_layers
        seen.append((lengths.pop() if len(lengths) == 1 else lengths, len(context) - 1))
        return tree

    drafter.propose = propose
    out = decoder.generate(prompts[0], MAX_NEW)
    assert len(seen) == len(out.steps) > 0
    assert all(cached == pairs for cached, pairs in seen)
    assert all(s.draft_tokens <= 8 and s.depth <= 4 for s in out.steps)
