"""Draft-LM distillation: the loss lands on the right positions, on-policy batches are well formed,
tokenizer mismatches are refused before training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.divergences import divergence
from draftsmith.models.draft_lm import DraftLMConfig, build_draft_lm, save_draft_lm
from draftsmith.train.distill import DistillConfig, DistillMethod


@pytest.fixture()
def method(tiny_random_target):
    torch.manual_seed(0)
    draft = build_draft_lm(DraftLMConfig(init="scratch", num_layers=1), tiny_random_target)
    return DistillMethod(tiny_random_target, draft, DistillConfig(divergence="rkl"), seed=0, pad_id=0)


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (2, 9), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0  # right padding
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 4:9] = 1  # answer tokens 4..8 of row 0
    loss_mask[1, 3:7] = 1  # answer tokens 3..6 of row 1
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def test_loss_is_the_divergence_at_the_positions_that_predict_answer_tokens(method):
    """Oracle: position t's distributions predict token t+1, so the trained positions are 3..7 and 2..5."""
    b = batch()
    sums, metrics = method.loss_terms(method.model, b)
    with torch.no_grad():
        q = method.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        p = method.target.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    rows = [(0, t) for t in range(3, 8)] + [(1, t) for t in range(2, 6)]
    expected = sum(
        F.kl_div(F.log_softmax(p[r, t], -1), F.log_softmax(q[r, t], -1), log_target=True, reduction="sum")
        for r, t in rows
    )  # KL(q || p): rkl
    assert float(method.token_counts(b)) == len(rows)
    assert float(sums[0].detach()) == pytest.approx(float(expected), rel=1e-4)
    accept = sum(float(divergence(p[r, t][None], q[r, t][None], "tvd")[1]) for r, t in rows)
    assert float(metrics["accept"][0]) == pytest.approx(accept, rel=1e-5)


def test_ce_baseline_is_cross_entropy_on_the_answer_tokens(tiny_random_target):
    torch.manual_seed(0)
    draft = build_draft_lm(DraftLMConfig(init="scratch", num_layers=1), tiny_random_target)
    m = DistillMethod(tiny_random_target, draft, DistillConfig(divergence="ce"), seed=0, pad_id=0)
    b = batch()
    sums, _ = m.loss_terms(m.model, b)
    with torch.no_grad():
        q = draft(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    ids = b["input_ids"]
    expected = sum(F.cross_entropy(q[0, t], ids[0, t + 1], reduction="sum") for t in range(3, 8)) + sum(
        F.cross_entropy(q[1, t], ids[1, t + 1], reduction="sum") for t in range(2, 6)
    )
    assert float(sums[0].detach()) == pytest.approx(float(expected), rel=1e-5)


def test_on_policy_batch_keeps_prompts_and_trains_only_the_drafts_samples(method):
    method.cfg = DistillConfig(divergence="rkl", on_policy=1.0, max_new_tokens=4)
    b = batch()
    new = method.prepare_batch(method.model, b, step=3, index=0, rank=0)
    again = method.prepare_batch(method.model, b, step=3, index=0, rank=0)
    assert all(torch.equal(new[k], again[k]) for k in new)  # seeded by (seed, step, index, rank)
    for row, first in ((0, 4), (1, 3)):
        assert torch.equal(new["input_ids"][row, :first], b["input_ids"][row, :first])  # the prompt
        assert new["loss_mask"][row, :first].sum() == 0
        n = int(new["loss_mask"][row].sum())
        assert 1 <= n <= 4 and new["loss_mask"][row, first : first + n].all()
        assert int(new["attention_mask"][row].sum()) == first + n
    text = {k: v.clone() for k, v in b.items()}
    text["loss_mask"][1] = text["attention_mask"][1]  # a text document: trained from its first token
    mixed = method.prepare_batch(method.model, text, step=3, index=0, rank=0)
    assert torch.equal(mixed["input_ids"][1, :7], b["input_ids"][1, :7])  # kept as it was
    assert (
        torch.equal(mixed["loss_mask"][1, :7], text["loss_mask"][1, :7])
        and mixed["loss_mask"][1, 7:].sum() == 0
    )
    method.cfg = DistillConfig(divergence="rkl", on_policy=0.0)
    assert method.prepare_batch(method.model, b, step=3, index=0, rank=0) is b


def test_a_draft_with_another_tokenizer_is_refused_before_training(tiny_random_target, tmp_path):
    from transformers import AutoTokenizer

    draft = build_draft_lm(DraftLMConfig(init="target", num_layers=1), tiny_random_target)
    ok = save_draft_lm(tmp_path / "ok", draft, tiny_random_target)
    loaded = build_draft_lm(DraftLMConfig(init="path", path=str(ok)), tiny_random_target)
    assert torch.equal(loaded.lm_head.weight, draft.lm_head.weight) and loaded.training

    other = AutoTokenizer.from_pretrained(ok)
    other.add_tokens(["<a token the target does not have>"])
    other.save_pretrained(ok)
    with pytest.raises(ValueError, match="different tokenizer"):
        build_draft_lm(DraftLMConfig(init="path", path=str(ok)), tiny_random_target)


@pytest.mark.parametrize("arch", ["qwen3_next", "llama"])
def test_offline_distillation_loads_every_layer_the_draft_copies(arch, tmp_path):
    """From an offline cache only the target's first layers are loaded: for a hybrid target whose 1-layer draft
    takes its first full-attention layer (index 3 of Qwen3-Next's tiny 4), that is 4 layers, not 1; the draft
    built from the partial load equals the one built from the whole target."""
    from bench import arch_matrix
    from draftsmith.config.loader import load_config
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train.distill import RECIPE, offline_target_layers

    path = arch_matrix.target_dir(arch, tmp_path)
    cfg = load_config(RECIPE, None, [f"target.path={path}", "draft.num_layers=1", "draft.init=target"])
    k = offline_target_layers(cfg)
    assert k == (4 if arch == "qwen3_next" else 1)
    partial = FrozenTarget.load(TargetConfig(path=str(path)), layers=k)
    whole = FrozenTarget.load(TargetConfig(path=str(path)))
    got, want = build_draft_lm(cfg.draft, partial), build_draft_lm(cfg.draft, whole)
    assert got.state_dict().keys() == want.state_dict().keys()
    for name, tensor in want.state_dict().items():
        assert torch.equal(got.state_dict()[name], tensor), name
    scratch = load_config(RECIPE, None, [f"target.path={path}", "draft.init=scratch"])
    assert offline_target_layers(scratch) == 0
