"""ModelOpt and speculators EAGLE-3 checkpoints, z-lab-layout DFlash exports (ModelOpt's) and speculators' DFlash
checkpoints convert into draftsmith checkpoints that compute the same thing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from bench.convert_peers import (
    MODELOPT_TO_DRAFTSMITH,
    SPECULATORS_TO_DRAFTSMITH,
    modelopt_dflash,
    modelopt_eagle3,
    speculators_dflash,
    speculators_eagle3,
    zlab_dflash,
)
from draftsmith.eval.drafters.dflash import DFlashDrafter
from draftsmith.eval.sampling import Sampling
from draftsmith.eval.tree import parse_tree
from draftsmith.models.checkpoint import load_drafter, save_drafter
from draftsmith.models.dflash import DFlashConfig, DFlashDraft
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft
from draftsmith.ship.export import export


def test_modelopt_export_round_trips_through_the_converter(tiny_random_target, tmp_path):
    """Oracle: write a draftsmith draft out in ModelOpt's layout (draft ids in frequency order, layer ids as
    outputs of layers), convert it back, and get identical target-id logits."""
    target = tiny_random_target
    V, vd = target.vocab_size, 40
    torch.manual_seed(0)
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=[2, 3, 4], ttt_steps=2), target.model.config, vd
    )
    used = torch.randperm(V)[:vd]  # frequency order: not sorted by target id
    inverse = {v: k for k, v in MODELOPT_TO_DRAFTSMITH.items()}
    state = {inverse[k]: v for k, v in draft.state_dict().items() if k in inverse}
    state["lm_head.weight"] = draft.lm_head_d.weight.detach().clone()
    state["d2t"] = used - torch.arange(vd)
    src = tmp_path / "modelopt"
    src.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(src / "model.safetensors"))
    (src / "config.json").write_text(
        json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})
    )

    loaded, config = load_drafter(modelopt_eagle3(src, target, tmp_path / "converted"), target)
    assert config["feature_layers"] == [2, 3, 4]  # ModelOpt's output of layer k is draftsmith's id k+1
    assert torch.equal(loaded.t2d.nonzero().flatten(), used.sort().values)
    draft.attach_target(target.embed_tokens, target.head)
    g = torch.randn(1, 5, 3 * target.hidden_size)
    ids = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        ref = draft.unroll(g, ids)[1][0]  # [T, vd] in the export's draft order
        got = loaded.unroll(g, ids)[1][0]
    # the same distribution over TARGET ids, whatever the draft-id order
    full_ref = torch.full((5, V), -1e9).index_copy(1, used, ref)
    full_got = torch.full((5, V), -1e9).index_copy(1, loaded.to_target_ids(torch.arange(vd)), got)
    torch.testing.assert_close(full_got, full_ref)


# --- vLLM speculators 0.9 ---------------------------------------------------------------------------------------

# The tensors of a REAL checkpoint written by bench/peers/speculators_eagle3.py (speculators 0.9.0,
# `Eagle3DraftModel.save_pretrained`) for the small-seed0 toy target: H=96, intermediate 288, 4 heads and 4 KV
# heads of 24, V=2048, draft vocabulary 1024.
REAL_SPECULATORS_LAYOUT = {
    "d2t": (1024,),
    "embed_tokens.weight": (2048, 96),
    "fc.weight": (96, 288),
    "layers.0.hidden_norm.weight": (96,),
    "layers.0.input_layernorm.weight": (96,),
    "layers.0.mlp.down_proj.weight": (96, 288),
    "layers.0.mlp.gate_proj.weight": (288, 96),
    "layers.0.mlp.up_proj.weight": (288, 96),
    "layers.0.post_attention_layernorm.weight": (96,),
    "layers.0.self_attn.k_proj.weight": (96, 192),
    "layers.0.self_attn.o_proj.weight": (96, 96),
    "layers.0.self_attn.q_proj.weight": (96, 192),
    "layers.0.self_attn.v_proj.weight": (96, 192),
    "lm_head.weight": (1024, 96),
    "norm.weight": (96,),
    "t2d": (2048,),
}


def speculators_layout(H, inter, q_out, kv_out, V, vd):
    """REAL_SPECULATORS_LAYOUT as a function of the sizes."""
    return {
        "d2t": (vd,),
        "embed_tokens.weight": (V, H),
        "fc.weight": (H, 3 * H),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.mlp.down_proj.weight": (H, inter),
        "layers.0.mlp.gate_proj.weight": (inter, H),
        "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.post_attention_layernorm.weight": (H,),
        "layers.0.self_attn.k_proj.weight": (kv_out, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, q_out),
        "layers.0.self_attn.q_proj.weight": (q_out, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv_out, 2 * H),
        "lm_head.weight": (vd, H),
        "norm.weight": (H,),
        "t2d": (V,),
    }


def speculators_config(target, layer_ids, vd, **flags):
    """The real config.json of that checkpoint, with the draft layer resized to `target` (flags override)."""
    c = target.model.config
    return {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": vd,
        "dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": layer_ids,
        "embed_requires_grad": False,
        "fc_norm": False,
        "norm_before_fc": False,
        "norm_before_residual": False,
        "norm_output": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "accept_tolerance": 0.0,
                    "proposal_type": "greedy",
                    "speculative_tokens": 7,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "/path/to/target"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "head_dim": c.head_dim,
            "hidden_act": c.hidden_act,
            "hidden_size": c.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": c.intermediate_size,
            "layer_types": ["sliding_attention"],
            "max_position_embeddings": c.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": c.num_attention_heads,
            "num_hidden_layers": 1,
            "num_key_value_heads": c.num_key_value_heads,
            "pad_token_id": None,
            "pretraining_tp": 1,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": 2048,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": True,
            "vocab_size": c.vocab_size,
        },
        "transformers_version": "5.19.0",
        **flags,
    }


def write_speculators(path, state, config):
    path.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


def draft_in_speculators_layout(target, vd, layer_ids):
    """A random draftsmith draft and the same weights in speculators' layout (draft ids sorted by target id,
    plus speculators' frozen copy of the target embedding)."""
    torch.manual_seed(1)
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=layer_ids, ttt_steps=3), target.model.config, vd
    )
    for p in draft.parameters():  # norms start at 1: randomise everything so a swapped norm shows
        torch.nn.init.normal_(p, 0.0, 0.3)
    used = torch.randperm(target.vocab_size)[:vd].sort().values
    d2t, t2d = used - torch.arange(vd), torch.zeros(target.vocab_size, dtype=torch.bool)
    t2d[used] = True
    draft.set_vocab_map(d2t, t2d)
    inverse = {v: k for k, v in SPECULATORS_TO_DRAFTSMITH.items()}
    state = {inverse[k]: v.detach().clone() for k, v in draft.state_dict().items() if k in inverse}
    state["lm_head.weight"] = draft.lm_head_d.weight.detach().clone()
    state["d2t"], state["t2d"] = d2t, t2d
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
    return draft, state, used


def test_speculators_checkpoint_round_trips_through_the_converter(tiny_random_target, tmp_path):
    """Oracle: a draftsmith draft written in speculators' layout converts back to identical logits (layer ids
    unshifted: speculators/vLLM id k is the input of layer k, draftsmith's canonical id k)."""
    target, vd = tiny_random_target, 40
    draft, state, used = draft_in_speculators_layout(target, vd, [2, 3, 4])
    src = write_speculators(tmp_path / "spec", state, speculators_config(target, [2, 3, 4], vd))

    loaded, config = load_drafter(
        speculators_eagle3(src, target, tmp_path / "converted", ttt_steps=3), target
    )
    assert config["feature_layers"] == [2, 3, 4]
    assert config["converted_from"]["peer"] == "speculators"
    assert torch.equal(loaded.t2d.nonzero().flatten(), used)
    draft.attach_target(target.embed_tokens, target.head)
    g = torch.randn(1, 6, 3 * target.hidden_size)
    ids = torch.randint(0, target.vocab_size, (1, 6))
    with torch.no_grad():
        for ref, got in zip(draft.unroll(g, ids), loaded.unroll(g, ids), strict=True):
            torch.testing.assert_close(got, ref)


def test_speculators_real_layout_converts(tiny_random_target, tmp_path):
    """The tensor names and shapes of a real speculators checkpoint are exactly what the converter reads."""
    target, vd = tiny_random_target, 40
    c = target.model.config
    assert speculators_layout(96, 288, 96, 96, 2048, 1024) == REAL_SPECULATORS_LAYOUT
    layout = speculators_layout(
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        target.vocab_size,
        vd,
    )
    torch.manual_seed(2)
    state = {k: torch.randn(shape) for k, shape in layout.items()}
    used = torch.randperm(target.vocab_size)[:vd].sort().values
    state["d2t"] = used - torch.arange(vd)
    state["t2d"] = torch.zeros(target.vocab_size, dtype=torch.bool).index_fill(0, used, True)
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
    src = write_speculators(tmp_path / "spec", state, speculators_config(target, [1, 2, 3], vd))

    loaded, config = load_drafter(speculators_eagle3(src, target, tmp_path / "converted"), target)
    assert config["feature_layers"] == [1, 2, 3]
    got = loaded.state_dict()
    for k, v in SPECULATORS_TO_DRAFTSMITH.items():
        assert torch.equal(got[v], state[k]), k
    assert torch.equal(got["lm_head_d.weight"], state["lm_head.weight"])  # already sorted by target id


@pytest.mark.parametrize(
    "change, message",
    [
        ({"config": {"norm_output": True}}, "norm_output"),
        ({"config": {"norm_before_fc": True}}, "norm_before_fc"),
        ({"config": {"norm_before_residual": True}}, "norm_before_residual"),
        ({"state": {"input_norm.weight": torch.ones(96)}}, "does not know"),
        ({"embed": 1e-3}, "not the target's embedding"),
        ({"t2d_flip": True}, "t2d does not mark"),
    ],
)
def test_speculators_converter_refuses_what_eagle3draft_cannot_compute(
    tiny_random_target, tmp_path, change, message
):
    target, vd = tiny_random_target, 40
    _, state, _ = draft_in_speculators_layout(target, vd, [2, 3, 4])
    state.update(change.get("state", {}))
    if "embed" in change:
        state["embed_tokens.weight"] = state["embed_tokens.weight"] + change["embed"]
    if change.get("t2d_flip"):
        state["t2d"] = state["t2d"].clone()
        state["t2d"][state["t2d"].nonzero()[0]] = False
        state["t2d"][(~state["t2d"]).nonzero()[-1]] = True
    src = write_speculators(
        tmp_path / "spec", state, speculators_config(target, [2, 3, 4], vd, **change.get("config", {}))
    )
    with pytest.raises(ValueError, match=message):
        speculators_eagle3(src, target, tmp_path / "converted")


# --- DFlash, z-lab's layout (NVIDIA ModelOpt 0.47's DFlashExporter, draftsmith's SGLang export) --------------


@pytest.fixture(scope="module")
def dflash_checkpoint(saved_tiny_target, tmp_path_factory):
    """A random draftsmith DFlash (every weight, norms included, perturbed so a swapped tensor shows)."""
    target = saved_tiny_target
    draft = DFlashDraft(
        DFlashConfig(
            block_size=4, num_layers=2, feature_layers=[2, 3], num_feature_layers=2, mask_token_id=5
        ),
        target.model.config,
        target.vocab_size,
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1 + noise if "norm" in name else noise)
    return save_drafter(tmp_path_factory.mktemp("dflash") / "ckpt", draft, target.identity())


def _proposals(drafter: DFlashDrafter, target, ids: torch.Tensor, tree: str):
    """The drafter's slot logits and proposed tree after the context `ids`, fed the target's features of ITS OWN
    feature layers (canonical ids), as the evaluator feeds them."""
    feats, _ = target.forward(ids[None], layer_ids=drafter.feature_layers)
    drafter.start()
    drafter.observe({lid: f[0, : len(ids) - 1] for lid, f in feats.items()})
    context = ids.tolist()
    logits = drafter.slot_logits(context, 3)
    drafter.start()
    drafter.observe({lid: f[0, : len(ids) - 1] for lid, f in feats.items()})
    proposal = drafter.propose(context, parse_tree(tree, 3), Sampling(), None)
    return logits, proposal.tokens


def test_dflash_zlab_export_round_trips_bit_identically(dflash_checkpoint, saved_tiny_target, tmp_path):
    """Oracle: draftsmith's own SGLang (z-lab) export of a DFlash drafter, converted back, is the same drafter:
    identical weights, bit-identical slot logits and proposals (chain and top-k tree) from the target's
    features. The layer ids cross the off-by-one both ways: z-lab id j names the OUTPUT of layer j."""
    target = saved_tiny_target
    exported, _, _ = export(dflash_checkpoint, "sglang", tmp_path / "zlab")
    config = json.loads((exported / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [1, 2]  # canonical 2, 3 minus one

    converted = zlab_dflash(exported, target, tmp_path / "converted", peer="draftsmith")
    ours, _ = load_drafter(dflash_checkpoint, target)
    theirs, theirs_config = load_drafter(converted, target)
    assert theirs_config["feature_layers"] == [2, 3]
    assert theirs_config["drafter"]["block_size"] == 4 and theirs_config["drafter"]["mask_token_id"] == 5
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, target.vocab_size, (11,), generator=torch.Generator().manual_seed(4))
    for tree in ("chain", "topk:3"):
        ref_logits, ref_tokens = _proposals(DFlashDrafter(ours), target, ids, tree)
        got_logits, got_tokens = _proposals(DFlashDrafter(theirs), target, ids, tree)
        assert torch.equal(got_logits, ref_logits)
        assert torch.equal(got_tokens, ref_tokens)


def test_dflash_layer_ids_are_outputs_of_layers(dflash_checkpoint, saved_tiny_target, tmp_path):
    """The off-by-one itself: the features z-lab / ModelOpt read for id j (`hidden_states[j + 1]`, the output of
    layer j) are exactly the features the converted drafter reads at its canonical ids, and reading them one
    layer off changes the draft."""
    target = saved_tiny_target
    exported, _, _ = export(dflash_checkpoint, "sglang", tmp_path / "zlab")
    ids = json.loads((exported / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    loaded, _ = load_drafter(zlab_dflash(exported, target, tmp_path / "converted"), target)
    tokens = torch.randint(0, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hs = target.model(tokens, output_hidden_states=True).hidden_states
        zlab = torch.cat([hs[j + 1] for j in ids], -1)  # ModelOpt: hidden_states[lid + 1]
        feats, _ = target.forward(tokens, layer_ids=loaded.feature_layers)
        assert torch.equal(torch.cat([feats[i] for i in loaded.feature_layers], -1), zlab)
        block = (torch.tensor([[6]]), torch.tensor([[True]]))
        right = loaded.logits(loaded(zlab, tokens, *block))
        shifted = loaded.logits(loaded(torch.cat([hs[j] for j in ids], -1), tokens, *block))
    assert not torch.allclose(right, shifted)


# The config.json of a REAL ModelOpt 0.47 DFlash export (bench/peers/modelopt_dflash.py, `DFlashExporter`) for the
# small-seed0 toy target (2 draft layers, taps = outputs of layers 1 and 5), with sizes swapped for the tiny
# target's; its model.safetensors holds exactly these 25 tensor names.
def modelopt_dflash_config(target, ids, **changes):
    c = target.model.config
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 8,
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": ids, "causal": False},
        "hidden_size": c.hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "num_target_layers": c.num_hidden_layers,
        "layer_types": ["full_attention", "full_attention"],
    }
    for key, value in changes.items():
        if key.startswith("dflash_config."):
            config["dflash_config"][key.removeprefix("dflash_config.")] = value
        else:
            config[key] = value
    return config


def modelopt_dflash_state(target):
    c = target.model.config
    H, q, kv, inter = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.intermediate_size,
    )
    shapes = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(2):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H),
                p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H),
                p + "self_attn.o_proj.weight": (H, q),
                p + "self_attn.q_norm.weight": (c.head_dim,),
                p + "self_attn.k_norm.weight": (c.head_dim,),
                p + "mlp.gate_proj.weight": (inter, H),
                p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter),
            }
        )
    assert len(shapes) == 25
    g = torch.Generator().manual_seed(6)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_modelopt_dflash_real_layout_converts(saved_tiny_target, tmp_path):
    target = saved_tiny_target
    state = modelopt_dflash_state(target)
    src = write_speculators(tmp_path / "modelopt", state, modelopt_dflash_config(target, [0, 2]))
    loaded, config = load_drafter(modelopt_dflash(src, target, tmp_path / "converted"), target)
    assert config["feature_layers"] == [1, 3]
    assert config["drafter"]["block_size"] == 8 and config["drafter"]["num_layers"] == 2
    assert config["converted_from"]["peer"] == "modelopt"
    got = loaded.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dflash_config.causal": True}, "causal"),
        ({"dflash_config.use_swa": True, "sliding_window": 64}, "sliding window"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding window"),
        ({"dflash_config.attention_sink_bias": True}, "sinks"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 32.0}}, "rope scaling"),
        ({"rms_norm_eps": 1.234e-3}, "rms_norm_eps"),
        ({"head_dim": 128}, "head_dim"),
        ({"num_target_layers": 36}, "36-layer"),
        ({"dflash_config.target_layer_ids": [0, 4]}, "name no layer"),
        ({"rope_theta": 1e6}, "rope_theta"),
    ],
)
def test_dflash_converter_refuses_what_dflashdraft_cannot_compute(
    saved_tiny_target, tmp_path, changes, message
):
    target = saved_tiny_target
    src = write_speculators(
        tmp_path / "modelopt",
        modelopt_dflash_state(target),
        modelopt_dflash_config(target, [0, 2], **changes),
    )
    with pytest.raises(ValueError, match=message):
        modelopt_dflash(src, target, tmp_path / "converted")


def test_dflash_converter_refuses_unknown_tensors(saved_tiny_target, tmp_path):
    target = saved_tiny_target
    state = {**modelopt_dflash_state(target), "layers.0.self_attn.attention_sink_bias": torch.zeros(4)}
    src = write_speculators(tmp_path / "modelopt", state, modelopt_dflash_config(target, [0, 2]))
    with pytest.raises(ValueError, match="does not know"):
        modelopt_dflash(src, target, tmp_path / "converted")


# ---- speculators' DFlash ---------------------------------------------------------------------------------


def test_dflash_speculators_export_round_trips_bit_identically(
    dflash_checkpoint, saved_tiny_target, tmp_path
):
    """Oracle: draftsmith's own vLLM (speculators) export of a DFlash drafter, converted back, is the same drafter:
    identical weights, bit-identical slot logits and proposals. speculators' ids are canonical (no shift); the
    export's embedding, LM head and identity vocabulary map are checked and dropped."""
    target = saved_tiny_target
    exported, _, _ = export(dflash_checkpoint, "vllm", tmp_path / "spec")
    assert json.loads((exported / "config.json").read_text())["aux_hidden_state_layer_ids"] == [2, 3]
    converted = speculators_dflash(exported, target, tmp_path / "converted")
    ours, _ = load_drafter(dflash_checkpoint, target)
    theirs, theirs_config = load_drafter(converted, target)
    assert (
        theirs_config["feature_layers"] == [2, 3] and theirs_config["converted_from"]["peer"] == "speculators"
    )
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, target.vocab_size, (11,), generator=torch.Generator().manual_seed(7))
    for tree in ("chain", "topk:3"):
        ref_logits, ref_tokens = _proposals(DFlashDrafter(ours), target, ids, tree)
        got_logits, got_tokens = _proposals(DFlashDrafter(theirs), target, ids, tree)
        assert torch.equal(got_logits, ref_logits) and torch.equal(got_tokens, ref_tokens)


# The config.json of a REAL speculators 0.9 DFlash checkpoint (bench/peers/speculators_dflash.py on the
# small-seed0 toy target: 2 layers, taps 2 and 6, every layer full attention), sizes swapped for the tiny target's;
# its model.safetensors holds the 25 tensors of ModelOpt's export and nothing else.
def speculators_dflash_config(target, ids, **changes):
    c = target.model.config
    layer = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": c.max_position_embeddings,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": c.num_key_value_heads,
        "pad_token_id": None,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c.vocab_size,
    }
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"": "config.DFlashSpeculatorConfig"},
        "aux_hidden_state_layer_ids": ids,
        "block_size": 8,
        "draft_vocab_size": c.vocab_size,
        "dtype": "float32",
        "mask_token_id": 0,
        "sample_from_anchor": False,
        "sliding_window_non_causal": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "accept_tolerance": 0.0,
                    "proposal_type": "greedy",
                    "speculative_tokens": 7,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "unused"},
        },
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
    }
    for key, value in changes.items():
        if key.startswith("layer."):
            layer[key.removeprefix("layer.")] = value
        else:
            config[key] = value
    return config


def test_speculators_dflash_real_layout_converts(saved_tiny_target, tmp_path):
    target = saved_tiny_target
    state = modelopt_dflash_state(target)
    src = write_speculators(tmp_path / "spec", state, speculators_dflash_config(target, [1, 3]))
    loaded, config = load_drafter(speculators_dflash(src, target, tmp_path / "converted"), target)
    assert config["feature_layers"] == [1, 3]  # canonical, as written
    assert config["drafter"]["block_size"] == 8 and config["drafter"]["num_layers"] == 2
    got = loaded.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {
                "layer.layer_types": ["sliding_attention"] * 2,
                "layer.use_sliding_window": True,
                "layer.sliding_window": 2048,
            },
            "sliding window",
        ),  # speculators' default draft layers
        ({"sample_from_anchor": True}, "sample_from_anchor"),
        ({"draft_vocab_size": 32}, "reduced draft vocabulary"),
        ({"speculators_model_type": "eagle3"}, "not a speculators DFlash"),
        ({"aux_hidden_state_layer_ids": [0, 2]}, "name no layer"),
        ({"layer.head_dim": 128}, "head_dim"),
    ],
)
def test_speculators_dflash_converter_refuses_what_dflashdraft_cannot_compute(
    saved_tiny_target, tmp_path, changes, message
):
    target = saved_tiny_target
    src = write_speculators(
        tmp_path / "spec", modelopt_dflash_state(target), speculators_dflash_config(target, [1, 3], **changes)
    )
    with pytest.raises(ValueError, match=message):
        speculators_dflash(src, target, tmp_path / "converted")


def test_speculators_dflash_refuses_a_reduced_vocabulary_map(saved_tiny_target, tmp_path):
    target = saved_tiny_target
    V = target.vocab_size
    state = {
        **modelopt_dflash_state(target),
        "d2t": torch.zeros(V, dtype=torch.long),
        "t2d": torch.ones(V, dtype=torch.bool),
    }
    src = write_speculators(tmp_path / "identity", state, speculators_dflash_config(target, [1, 3]))
    speculators_dflash(src, target, tmp_path / "ok")  # the identity map converts
    state["t2d"][3] = False
    src = write_speculators(tmp_path / "reduced", state, speculators_dflash_config(target, [1, 3]))
    with pytest.raises(ValueError, match="reduced draft vocabulary"):
        speculators_dflash(src, target, tmp_path / "converted")
