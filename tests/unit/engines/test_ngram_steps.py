"""engine-eval's n-gram comparison without vLLM: the evaluator, run under engine-eval's settings, drafts on the
steps vLLM's rule drafts on, worked out by hand on a target whose greedy answer is known.

vLLM 0.32's rule (v1/spec_decode/ngram_proposer.py, v1/worker/gpu_model_runner.py, v1/core/sched/scheduler.py):
after every forward that samples a token, the prefill's included, the proposer looks up the longest suffix
n-gram (prompt_lookup_min..max) of prompt + output, the token just sampled included, earlier in the same
tokens, continues its earliest occurrence with up to K tokens, and a step without a match carries no draft and is
not counted; the last step before max_tokens drafts the full K and counts every acceptance. The one step vLLM
counts beyond this rule (a prompt cached up to its last token, padded with K placeholder drafts) is kept out by
running vLLM without prefix caching (`engine_eval.job`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from draftsmith.engines.engine_eval import evaluator_settings, job
from draftsmith.engines.engine_report import comparable
from draftsmith.engines.settings import EngineEvalArgs
from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.drafters import NgramDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.target import FrozenTarget, stop_token_ids

# the target's greedy successor of each token of the example (every other token goes to 0)
SUCCESSOR = {12: 10, 10: 11, 11: 12}
HIDDEN = 32


@pytest.fixture(scope="module")
def successor_target(toy_tokenizer) -> FrozenTarget:
    """A one-layer Llama whose greedy next token is SUCCESSOR[current token]: attention and MLP write nothing
    (o_proj, down_proj zero), the embedding of token t < HIDDEN is the t-th unit vector, and the LM head maps
    unit vector t to SUCCESSOR[t]."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * HIDDEN,
        vocab_size=len(toy_tokenizer),
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.zeros(cfg.vocab_size, HIDDEN)
        emb[:HIDDEN] = torch.eye(HIDDEN)
        model.model.embed_tokens.weight.copy_(emb)
        head = torch.zeros(cfg.vocab_size, HIDDEN)
        for t in range(HIDDEN):
            head[SUCCESSOR.get(t, 0), t] = 1.0
        model.lm_head.weight.copy_(head)
    return FrozenTarget(model, toy_tokenizer, "successor-llama")


def _decode(target: FrozenTarget, prompt: list[int], max_new: int, depth: int, at_budget: str) -> Any:
    settings = evaluator_settings(
        EngineEvalArgs(target="t", drafter="ngram", data="d", max_new_tokens=max_new, depth=depth)
    )
    drafter = NgramDrafter(settings.ngram_max, settings.ngram_min, settings.ngram_match)
    decoder = SpeculativeDecoder(
        target, drafter, parse_tree("chain", depth), Sampling(), drafts_at_budget=at_budget
    )
    return decoder.generate(prompt, max_new)


def test_the_evaluator_drafts_on_the_steps_vllms_rule_drafts_on(successor_target):
    """Prompt 5 10 6 12, K = 3, max_tokens 9, n-grams of 1..3. By hand, as vLLM schedules it:
    prefill: samples 10.                      context 5 10 6 12 | 10
    step 1: suffix (10) occurs at 1 -> 6 12 10. 10 is followed by 11: none accepted, 11 committed.
    step 2: no suffix of ... 10 11 occurs earlier: no draft, not counted; 12 committed.
    step 3: (12) occurs at 3 -> 10 11 12: all accepted, + 10: out = 10 11 12 10 11 12 10 (7).
    step 4: (11 12 10) occurs at 5 -> 11 12 10, full depth with 2 tokens left: all 3 accepted and counted,
            2 committed (the budget).
    vLLM counts 3 steps with drafts, 9 draft tokens, 6 accepted: mean acceptance length 1 + 6/3 = 3.0,
    positions 2/3, 2/3, 2/3; the evaluator's tau is 8 committed / 4 forwards = 2.0."""
    assert not {5, 6, 10, 11, 12} & stop_token_ids(successor_target)
    gen = _decode(successor_target, [5, 10, 6, 12], 9, 3, "full")
    assert gen.tokens == [10, 11, 12, 10, 11, 12, 10, 11, 12]
    assert [(s.draft_tokens, s.accepted, s.committed) for s in gen.steps] == [
        (3, 0, 1),
        (0, 0, 1),
        (3, 3, 4),
        (3, 3, 2),
    ]
    turn = SimpleNamespace(spec=gen)
    got = comparable([turn])
    assert (got["num_steps"], got["num_drafts"], got["num_draft_tokens"], got["num_accepted_tokens"]) == (
        4,
        3,
        9,
        6,
    )
    assert got["mean_acceptance_length"] == pytest.approx(3.0)
    assert got["acceptance_by_position"] == pytest.approx([2 / 3, 2 / 3, 2 / 3])
    # `draftsmith eval`'s default instead shrinks the last draft to the 1 token that still fits (as transformers
    # does): one draft token and one acceptance fewer than vLLM counts
    shrunk = comparable([SimpleNamespace(spec=_decode(successor_target, [5, 10, 6, 12], 9, 3, "shrink"))])
    assert (shrunk["num_drafts"], shrunk["num_draft_tokens"], shrunk["num_accepted_tokens"]) == (3, 7, 4)


def test_vllm_runs_without_prefix_caching_so_no_placeholder_draft_is_counted():
    """vLLM pads a new request whose prompt is cached up to its last token to one token + K placeholder (-1)
    drafts and counts that step as a draft with none accepted. On the tiny target with stdlib:heldout's first
    prompt (129 tokens: one 128-token block cached by the warm-up request, 1 token left), 16 new tokens, 2
    prompts, vLLM counted 13 drafted steps against the evaluator's 12 (-2.6 %); off, 12 and 12. Every job
    engine-eval sends asks for it off, plain or speculative."""
    args = EngineEvalArgs(target="t", drafter="ngram", data="d")
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    for speculative in (None, spec):
        assert job(args, [[1, 2, 3]], [0], speculative, 64)["enable_prefix_caching"] is False


def test_the_replayed_schedule_is_the_evaluators_own_decoding_at_every_depth(successor_target):
    """engine-eval --depths predicts prompt lookup from its plain answer replayed at each K (depth_check.py
    `ngram_schedules`): its steps and steps with drafts must be those the evaluator's decoder takes under vLLM's
    rule (full drafts at the budget), and its accepted tokens those of that decoding that fall inside the answer
    (vLLM also counts acceptances past max_tokens, which no replay of the answer can see)."""
    from draftsmith.engines.depth_check import ngram_schedules

    prompt = [5, 10, 6, 12, 7, 10, 11]
    settings = evaluator_settings(EngineEvalArgs(target="t", drafter="ngram", data="d"))
    proposer = NgramDrafter(settings.ngram_max, settings.ngram_min, settings.ngram_match)
    for depth in (1, 2, 3, 5):
        full = _decode(successor_target, prompt, 14, depth, "full")
        replayed = ngram_schedules(proposer, [prompt], [full.tokens], [depth])[depth]
        assert replayed.tokens == len(full.tokens) == 14
        assert replayed.steps == len(full.steps) + 1  # + the prompt's forward, which samples the first token
        assert replayed.drafting == sum(1 for s in full.steps if s.draft_tokens)
        inside, done = 0, 1  # the prompt's forward committed the first token
        for step in full.steps:
            inside, done = inside + min(step.accepted, 14 - done), done + step.committed
        assert replayed.accepted == inside
        assert sum(s.accepted for s in full.steps) >= inside
