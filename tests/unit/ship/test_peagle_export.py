"""The P-EAGLE speculators export, re-read by a loader written from the documented layout (ship/layouts/peagle.py,
docs/ALGORITHMS-BLOCK.md section 2.4): it computes the drafts draftsmith's one-pass inference computes, carries
the engine's config and serve command, and is refused for the engines that do not serve P-EAGLE."""

from __future__ import annotations

import json
from pathlib import Path

import engine_reference as ref
import pytest
import torch

from draftsmith.eval.drafters.peagle import PEagleDrafter
from draftsmith.models.checkpoint import load_drafter, save_drafter
from draftsmith.models.eagle3 import build_vocab_map
from draftsmith.models.peagle import PEagleConfig, PEagleDraft
from draftsmith.ship.export import export
from draftsmith.ship.layouts.common import ExportError

VD, LAYERS, DEPTHS, MASK = 100, 3, 4, 7


@pytest.fixture(scope="module")
def ckpt(saved_tiny_target, tmp_path_factory) -> Path:
    target = saved_tiny_target
    cfg = PEagleConfig(
        feature_layers=[1, 2, 3],
        draft_vocab_size=VD,
        num_layers=LAYERS,
        num_depths=DEPTHS,
        mask_token_id=MASK,
        mask_embedding="learned",
    )
    draft = PEagleDraft(cfg, target.model.config, VD)
    draft.set_vocab_map(
        *build_vocab_map(
            torch.randint(0, 1000, (target.vocab_size,), generator=torch.Generator().manual_seed(1)), VD
        )
    )
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1 + noise if p.ndim == 1 and "norm" in name else noise)
    return save_drafter(tmp_path_factory.mktemp("peagle") / "final", draft, target.identity())


def reference_chain(export_dir: Path, g: torch.Tensor, ids: torch.Tensor, depth: int) -> torch.Tensor:
    """The engine's parallel draft from the export alone: real rows j (fc(g_j), embed(x_{j+1})) then depth-1 mask
    rows (fc(mask_hidden), embed(mask_token_id)), one causal pass at positions 0..; layer 0 is EAGLE-3's fused
    layer, layers >= 1 Llama layers. Returns target-vocabulary logits (-inf outside the draft vocabulary) of the
    last real row and the mask rows `[depth, V]`."""
    config, w = ref.read(export_dir)
    cfg = dict(config["transformer_layer_config"])
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    eps, H = cfg["rms_norm_eps"], config["target_hidden_size"]
    emb = w["embed_tokens.weight"]
    k = depth - 1
    hidden = torch.cat([g, w["mask_hidden"].reshape(1, 3 * H).expand(k, -1)]) @ w["fc.weight"].T
    tokens = torch.cat([ids, torch.full((k,), config["mask_token_id"])])
    u = torch.cat(
        [
            ref.rms(emb[tokens], w["layers.0.input_layernorm.weight"], eps),
            ref.rms(hidden, w["layers.0.hidden_norm.weight"], eps),
        ],
        -1,
    )
    x = hidden + ref.attention(u, w, "layers.0.", cfg)
    x = x + ref.mlp(ref.rms(x, w["layers.0.post_attention_layernorm.weight"], eps), w, "layers.0.")
    for i in range(1, cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = x + ref.attention(ref.rms(x, w[p + "input_layernorm.weight"], eps), w, p, cfg)
        x = x + ref.mlp(ref.rms(x, w[p + "post_attention_layernorm.weight"], eps), w, p)
    draft_logits = ref.rms(x[-depth:], w["norm.weight"], eps) @ w["lm_head.weight"].T
    out = torch.full((depth, emb.shape[0]), float("-inf"))
    out[:, torch.arange(w["d2t"].shape[0]) + w["d2t"]] = draft_logits
    return out


@torch.no_grad()
def test_peagle_export_computes_the_trained_drafts(ckpt, saved_tiny_target, tmp_path):
    target = saved_tiny_target
    out, passed, built = export(ckpt, "vllm", tmp_path / "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["architectures"] == ["PEagleSpeculator"]
    assert config["mask_token_id"] == MASK and config["embed_requires_grad"] is True
    assert config["transformer_layer_config"]["num_hidden_layers"] == LAYERS
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM's convention = canonical
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == DEPTHS
    serve = json.loads(built.serve[0].split("--speculative-config ")[1].strip("'"))
    assert serve == {
        "method": "eagle3",
        "model": "{dir}",
        "num_speculative_tokens": DEPTHS,
        "parallel_drafting": True,
    }

    draft, _ = load_drafter(ckpt, target)
    weights = ref.read(out)[1]
    table = target.embed_tokens.weight
    assert torch.equal(weights["embed_tokens.weight"][MASK], draft.mask_embedding)  # the learned mask row
    others = torch.arange(table.shape[0]) != MASK
    assert torch.equal(
        weights["embed_tokens.weight"][others], table[others]
    )  # every real token: the target's
    assert torch.equal(weights["mask_hidden"].flatten(), draft.mask_hidden)

    g = torch.randn(9, 3 * target.hidden_size, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(0, target.vocab_size, (10,), generator=torch.Generator().manual_seed(4))
    ids[ids == MASK] = (
        MASK + 1
    )  # a dedicated mask id never occurs in text (the engine would embed it as the mask)
    drafter = PEagleDrafter(draft)
    drafter.start()
    drafter.observe({i: g[:, (i - 1) * target.hidden_size : i * target.hidden_size] for i in (1, 2, 3)})
    ours = drafter.chain_logits(ids.tolist(), DEPTHS)  # [DEPTHS, Vd]
    theirs = reference_chain(out, g, ids[1:], DEPTHS)
    torch.testing.assert_close(theirs[:, draft.to_target_ids(torch.arange(VD))], ours, atol=1e-5, rtol=1e-5)


def test_peagle_is_refused_where_it_is_not_served(ckpt, tmp_path):
    for engine in ("sglang", "tgi"):
        with pytest.raises(
            ExportError, match=rf"{engine} does not serve peagle drafters; export peagle with --to hf \| vllm"
        ):
            export(ckpt, engine, tmp_path / engine)
        assert not (tmp_path / engine).exists()
