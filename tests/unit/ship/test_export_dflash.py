"""DFlash exports (docs/ALGORITHMS-BLOCK.md 1.5): each layout re-read by a loader written from its documented
layout computes the trained slot logits, taking the target's hidden states by the ENGINE's layer ids (z-lab /
SGLang: output of layer j = hidden_states[j + 1]; speculators: hidden_states[i]), so a convention slip shows."""

from __future__ import annotations

import json
from pathlib import Path

import engine_reference as ref
import pytest
import torch
from safetensors.torch import load_file

from draftsmith.models.checkpoint import load_drafter, save_drafter
from draftsmith.models.dflash import DFlashConfig, DFlashDraft
from draftsmith.ship.export import export
from draftsmith.ship.layouts.common import ExportError

B, TAPS, MASK = 4, [2, 3], 5


@pytest.fixture(scope="module")
def target(saved_tiny_target):
    return saved_tiny_target


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory) -> Path:
    draft = DFlashDraft(
        DFlashConfig(block_size=B, num_layers=2, feature_layers=TAPS, mask_token_id=MASK),
        target.model.config,
        target.vocab_size,
    )
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1 + noise if "norm" in name else noise)
    return save_drafter(tmp_path_factory.mktemp("dflash") / "ckpt", draft, target.identity())


def reference_block(
    export_dir: Path,
    hidden_states: tuple[torch.Tensor, ...],
    ids: torch.Tensor,
    anchor: int,
    embedding: torch.Tensor,
    lm_head: torch.Tensor | None,
    engine: str,
) -> torch.Tensor:
    """Slot logits `[B, V]` of the block anchored at `anchor`, as the engine's DFlash module computes them."""
    config, w = ref.read(export_dir)
    if engine == "sglang":
        cfg, dc = config, config["dflash_config"]
        feats = [hidden_states[j + 1] for j in dc["target_layer_ids"]]  # layer OUTPUTS
        mask, block = dc["mask_token_id"], config["block_size"]
    else:
        cfg = config["transformer_layer_config"]
        feats = [hidden_states[i] for i in config["aux_hidden_state_layer_ids"]]  # captured before layer i
        mask, block = config["mask_token_id"], config["block_size"]
        lm_head = w["lm_head.weight"]
        embedding = w["embed_tokens.weight"]
    eps, nh, nkv, hd = (
        cfg["rms_norm_eps"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    c = ref.rms(torch.cat(feats, -1)[0, :anchor] @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    blk = torch.tensor([int(ids[0, anchor])] + [mask] * (block - 1))
    u = embedding[blk]
    positions = torch.arange(anchor + block)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = ref.rms(u, w[p + "input_layernorm.weight"], eps)
        kv = torch.cat([c, x])
        q = ref.rms(
            (x @ w[p + "self_attn.q_proj.weight"].T).view(block, nh, hd),
            w[p + "self_attn.q_norm.weight"],
            eps,
        )
        k = ref.rms(
            (kv @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, hd), w[p + "self_attn.k_norm.weight"], eps
        )
        v = (kv @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
        q, k = ref.rope(q, positions[anchor:], cfg["rope_theta"]), ref.rope(k, positions, cfg["rope_theta"])
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        )
        u = u + o.transpose(0, 1).reshape(block, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        u = u + ref.mlp(ref.rms(u, w[p + "post_attention_layernorm.weight"], eps), w, p)
    assert lm_head is not None
    return ref.rms(u, w["norm.weight"], eps) @ lm_head.T


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_dflash_export_computes_the_trained_slot_logits(checkpoint, target, tmp_path, engine):
    out, passed, built = export(checkpoint, engine, tmp_path / engine)
    draft, _ = load_drafter(checkpoint, target)
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, target.vocab_size, (1, 12), generator=g)
    with torch.no_grad():
        hs = target.model(ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in TAPS], -1)
        for anchor in (0, 5, 8):
            ours = draft.logits(draft(feats, ids, torch.tensor([[anchor]]), torch.tensor([[True]])))[0]
            theirs = reference_block(
                out, hs, ids, anchor, target.embed_tokens.weight, target.lm_head.weight, engine
            )
            torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    config = json.loads((out / "config.json").read_text())
    if engine == "sglang":
        assert config["dflash_config"]["target_layer_ids"] == [1, 2]  # canonical - 1
        assert "embed_tokens.weight" not in load_file(str(out / "model.safetensors"))
    else:
        assert config["aux_hidden_state_layer_ids"] == TAPS
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == B - 1
        assert any("bit-identical to the target's embedding" in p for p in passed)
        # a full-vocabulary drafter ships no vocabulary map: vLLM has no parameter for one and refuses it
        assert not {"d2t", "t2d"} & set(load_file(str(out / "model.safetensors")))
    assert any("DFLASH" in s or '"dflash"' in s for s in built.serve)


def test_a_dflash_export_with_a_wrong_mask_token_is_refused(checkpoint, target, tmp_path, monkeypatch):
    """The validator's config checks are derived from the checkpoint, not from the export: a layout that wrote
    another mask token (or other layer ids) is refused with nothing written."""
    import draftsmith.ship.layouts.dflash as layouts

    real = layouts.dflash_sglang

    def wrong(source, target_info, engine):
        built, spec = real(source, target_info, engine)
        built.config["dflash_config"] = {
            **built.config["dflash_config"],
            "mask_token_id": MASK + 1,
            "target_layer_ids": TAPS,
        }
        return built, spec

    monkeypatch.setattr("draftsmith.ship.export.layout_for", lambda kind, to: wrong)
    with pytest.raises(
        ExportError, match=r"mask_token_id.*\n.*target_layer_ids|target_layer_ids.*\n.*mask_token_id"
    ):
        export(checkpoint, "sglang", tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
