"""Medusa-2: only the LoRA weights of the target change, self-distillation starts at zero, the loss terms."""

from __future__ import annotations

import hashlib

import torch
from conftest import make_tiny_llama

from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.medusa2 import Medusa2Config, Medusa2Model
from draftsmith.train.medusa import Medusa2Method

V = 40


def checksum(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(1))
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 4:] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def build(seed: int = 0) -> tuple[Medusa2Model, Medusa2Method]:
    torch.manual_seed(seed)
    llama = make_tiny_llama(V, layers=2, hidden=32)
    heads = MedusaHeads(MedusaConfig(num_heads=2), 32, V)
    heads.init_from_lm_head(llama.lm_head.weight)
    cfg = Medusa2Config(enabled=True, lora_r=4, heads_lr_scale=2.0)
    model = Medusa2Model(llama, heads, cfg)
    return model, Medusa2Method(model, cfg)


def test_only_lora_weights_of_the_target_change():
    model, method = build()
    before = {n: checksum(p) for n, p in model.backbone.named_parameters() if "lora_" not in n}
    lora_b = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if "lora_B" in n}
    groups = method.param_groups()
    optimizer = torch.optim.AdamW([{"params": g["params"]} for g in groups], lr=1e-2)
    for _ in range(3):
        sums, _ = method.loss_terms(model, batch())
        (method.term_weights * sums / method.token_counts(batch())).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    after = {n: checksum(p) for n, p in model.backbone.named_parameters() if "lora_" not in n}
    assert after == before  # every non-adapter target tensor bit-identical
    assert any(not torch.equal(p, lora_b[n]) for n, p in model.backbone.named_parameters() if "lora_B" in n)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith("heads.") for n in trainable)
    assert {id(p) for g in groups for p in g["params"]} == {
        id(p) for p in model.parameters() if p.requires_grad
    }


def test_self_distillation_starts_at_zero_and_the_terms_are_weighted_as_the_paper():
    model, method = build()
    b = batch()
    adapted, heads, original = model(b["input_ids"], b["attention_mask"])
    torch.testing.assert_close(adapted, original)  # LoRA B starts at zero: the adapter is the identity
    sums, metrics = method.loss_terms(model, b)
    assert float(sums[0].detach()) == 0.0 and float(metrics["top1"][0]) == float(method.token_counts(b)[0])
    assert method.term_names == ["base", "depth1", "depth2"]
    torch.testing.assert_close(method.term_weights, torch.tensor([1.0, 0.2 * 0.8, 0.2 * 0.64]))
    assert method.param_groups()[0]["start_step"] == 0 and method.param_groups()[1]["lr_scale"] == 2.0
    assert heads.shape == (2, 2, 10, V)
