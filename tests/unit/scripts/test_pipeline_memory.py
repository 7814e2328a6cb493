"""The pipeline's GPU sizing: EAGLE-3's activation estimate against what autograd keeps, and the micro batch
and answer batch it leads to against hand-computed budgets (the GPU's memory faked: no GPU in the suite)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.scripts import pipeline_memory
from draftsmith.scripts.pipeline_memory import answer_batch_size, eagle3_activation_bytes, train_micro_batch
from draftsmith.scripts.pipeline_plan import BUDGETS, Plan
from draftsmith.scripts.pipeline_stages import training_settings


def saved_bytes(fn, params) -> int:
    """Bytes of the distinct non-parameter storages that autograd saves for the backward pass while `fn` runs."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


# SmolLM2-135M's layer shape (hidden 576, MLP 1,536, 9 heads of which 3 kv) and a small one
@pytest.mark.parametrize("hidden,mlp,heads,kv_heads", [(576, 1536, 9, 3), (64, 256, 4, 2)])
@pytest.mark.parametrize("steps", [1, 4, 7])
def test_the_activation_estimate_bounds_what_autograd_keeps(hidden, mlp, heads, kv_heads, steps):
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=4,
    )
    torch.manual_seed(0)
    target = LlamaForCausalLM(config)
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=steps), config, 256)
    draft.attach_target(target.get_input_embeddings(), target.get_output_embeddings())
    B, T = 2, 48
    features, ids = torch.randn(B, T, 3 * hidden), torch.randint(0, 256, (B, T))
    params = [*draft.parameters(), *target.parameters()]
    kept = saved_bytes(lambda: draft.unroll_hidden(features, ids), params) / (B * T)
    estimate = eagle3_activation_bytes(config, steps)
    assert kept <= estimate <= 1.25 * kept, (kept, estimate)


@pytest.fixture
def gpu(monkeypatch):
    """A faked GPU whose total memory the test sets: `gpu(total_bytes)`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def set_total(total: int) -> None:
        props = SimpleNamespace(total_memory=total)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)

    return set_total


def test_the_micro_batch_fills_half_the_gpu_with_activations(tiny_toy_target, gpu, tmp_path):
    plan = Plan(tiny_toy_target, {}, "bfloat16", BUDGETS["short"], tmp_path, [], progress=False)
    config = AutoConfig.from_pretrained(tiny_toy_target)
    per_sample = eagle3_activation_bytes(config, 4) * 320  # the recipe's ttt_steps and data.max_len
    gpu(int(13.5 * per_sample / pipeline_memory.GPU_TRAIN_SHARE))  # room for 13.5 samples: 8, a power of two
    assert train_micro_batch(tiny_toy_target, plan.recipe, [], 10_000) == 8
    overrides = ["draft.ttt_steps=2", "data.max_len=80"]  # fewer steps and shorter samples: a wider batch
    smaller = eagle3_activation_bytes(config, 2) * 80
    assert train_micro_batch(tiny_toy_target, plan.recipe, overrides, 10_000) == 2 ** (
        int(13.5 * per_sample / smaller).bit_length() - 1
    )
    gpu(10**15)
    assert train_micro_batch(tiny_toy_target, plan.recipe, [], 10_000) == pipeline_memory.GPU_TRAIN_CAP
    assert train_micro_batch(tiny_toy_target, plan.recipe, [], 480) == 16  # 480 / 16 = 30 -> 16
    assert train_micro_batch(tiny_toy_target, plan.recipe, [], 5) == 1
    assert train_micro_batch(tiny_toy_target, plan.recipe, ["train.micro_batch_size=3"], 480) is None
    assert train_micro_batch(tmp_path / "model.gguf", plan.recipe, [], 480) is None


def test_the_micro_batch_reaches_training_and_names_its_run(tiny_toy_target, tmp_path):
    plan = Plan(tiny_toy_target, {}, "bfloat16", BUDGETS["short"], tmp_path, [], progress=False)
    sized = Plan(tiny_toy_target, {}, "bfloat16", BUDGETS["short"], tmp_path, [], False, micro_batch=32)
    plan.answers.parent.mkdir(parents=True)
    plan.answers.write_text('{"messages": []}\n')  # the run is named by the answers' bytes too
    assert "train.micro_batch_size=32" in training_settings(sized)
    assert not any("micro_batch_size" in s for s in training_settings(plan))
    assert (
        sized.training_tag != plan.training_tag
    )  # a run sized for another device is not resumed as this one


def test_no_gpu_keeps_the_cpu_settings(tiny_toy_target, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = Plan(tiny_toy_target, {}, "float32", BUDGETS["short"], tmp_path, [], progress=False).recipe
    assert train_micro_batch(tiny_toy_target, recipe, [], 480) is None
    assert answer_batch_size(tiny_toy_target, 256, "bfloat16") == 64  # a CPU's, measured
