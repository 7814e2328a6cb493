"""`data regenerate --compile on`: transformers' static cache and its compiled forward give the same greedy
answers as the default path (the growing cache, eager), token for token, batch padding included."""

from __future__ import annotations

import functools

import pytest
import torch

from draftsmith.data.chat_render import render_prompt
from draftsmith.data.conversations import prompt_turns, read_conversations
from draftsmith.data.regen_output import Sampling
from draftsmith.models.target import FrozenTarget, TargetConfig, stop_token_ids
from draftsmith.scripts.data import regenerate_local


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_static_cache_answers_equal_the_default_path(tiny_toy_target, monkeypatch, backend):
    """The static cache is checked with torch.compile's eager backend in the default run (no inductor build on
    2 cores), and with inductor, as `--compile on` runs, among the slow tests."""
    config = functools.partial(regenerate_local.CompileConfig, backend=backend)
    monkeypatch.setattr(regenerate_local, "CompileConfig", config)
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    convs = read_conversations("stdlib:train", "auto", 6)
    prompts = [render_prompt(target.tokenizer, prompt_turns(c)[0], c.tools) for c in convs]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    sampling, stop = Sampling(0.0, 1.0, 0, 20, 0), stop_token_ids(target)
    with torch.no_grad():
        plain = regenerate_local.generate_batch(target.model, target.tokenizer, prompts, sampling, stop)
        compiled = regenerate_local.generate_batch(
            target.model, target.tokenizer, prompts, sampling, stop, compiled=True
        )
    assert compiled == plain and sum(len(t) for t, _ in plain) > 0


def test_compile_auto_is_for_a_gpu_only():
    assert regenerate_local.compile_answers("auto", torch.device("cuda")) is True
    assert regenerate_local.compile_answers("auto", torch.device("cpu")) is False
    assert regenerate_local.compile_answers("on", torch.device("cpu")) is True
    assert regenerate_local.compile_answers("off", torch.device("cuda")) is False
