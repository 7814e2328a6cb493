"""Engine exports: every layout re-read by a loader written from the engine's documented layout computes what
draftsmith trained; every silent-failure class of ENGINES.md section 1 item 2 is refused with nothing written;
the layer-id table; and, where the speculators package is installed, the closed loop through its own code."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import engine_reference as ref
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import Eagle1Draft, EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.mtp import MTPConfig, MTPDraft
from draftsmith.models.parts import shift_left
from draftsmith.models.target import FrozenTarget
from draftsmith.ship.export import export, main
from draftsmith.ship.layouts.common import ExportError, from_engine_ids, to_engine_ids, validate
from draftsmith.ship.layouts.target_info import TargetInfo

VD = 100  # pruned EAGLE-3 draft vocabulary


@pytest.fixture(scope="module")
def target(saved_tiny_target) -> FrozenTarget:
    """The tiny random Llama read from a model directory (exports read the target from disk)."""
    return saved_tiny_target


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1 + noise if p.ndim == 1 and "norm" in name else noise)


def _eagle3(
    target: FrozenTarget, layer: Literal["llama", "qwen3"] = "llama", num_layers: int = 1
) -> Eagle3Draft:
    draft = Eagle3Draft(
        EagleConfig(
            version=3,
            feature_layers=[1, 2, 3],
            draft_vocab_size=VD,
            ttt_steps=3,
            layer=layer,
            num_layers=num_layers,
        ),
        target.model.config,
        VD,
    )
    counts = torch.randint(0, 1000, (target.vocab_size,), generator=torch.Generator().manual_seed(1))
    draft.set_vocab_map(*build_vocab_map(counts, VD))
    _randomize(draft, 2)
    return draft


def _eagle1(target: FrozenTarget, fc_bias: bool = True) -> Eagle1Draft:
    draft = Eagle1Draft(EagleConfig(version=1, fc_bias=fc_bias), target.model.config, target.vocab_size)
    _randomize(draft, 3)
    return draft


def _medusa(target: FrozenTarget) -> MedusaHeads:
    heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1), target.hidden_size, target.vocab_size)
    _randomize(heads, 4)
    return heads


def _mtp(target: FrozenTarget) -> MTPDraft:
    draft = MTPDraft(MTPConfig(num_modules=2), target.model.config, target.vocab_size)
    _randomize(draft, 5)
    return draft


BUILDERS: dict[str, Callable[[FrozenTarget], torch.nn.Module]] = {
    "eagle3": _eagle3,
    "eagle": _eagle1,
    "medusa": _medusa,
    "mtp": _mtp,
    "eagle3_qwen3": lambda target: _eagle3(target, "qwen3"),
    "eagle3_two_layers": lambda target: _eagle3(target, num_layers=2),
}


@pytest.fixture(scope="module")
def checkpoints(target, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return {
        kind: save_drafter(root / kind, build(target), target.identity()) for kind, build in BUILDERS.items()
    }


def _inputs(target: FrozenTarget, T: int = 12, width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(1, T, width * target.hidden_size, generator=g), torch.randint(
        0, target.vocab_size, (1, T), generator=g
    )


def _loaded(kind: str, ckpt: Path, target: FrozenTarget):
    from draftsmith.models.checkpoint import load_drafter

    model, _ = load_drafter(ckpt, target)
    return model


# ---- layer ids -------------------------------------------------------------------------------------------


def test_layer_id_table_matches_the_engines_conventions():
    # EAGLE-3's paper taps on a 32-layer Llama: canonical 2, 16, 29 (inputs of those layers).
    assert to_engine_ids([2, 16, 29], "vllm", 32) == [2, 16, 29]  # vLLM captures before layer k
    assert to_engine_ids([2, 16, 29], "sglang", 32) == [1, 15, 28]  # SGLang adds +1: the output of layer k
    assert to_engine_ids([2, 16, 29], "trtllm", 32) == [1, 15, 28]  # TRT-LLM default {1, L/2-1, L-4}
    for engine in ("vllm", "sglang", "trtllm", "modelopt"):
        assert from_engine_ids(to_engine_ids([3, 9, 30], engine, 32), engine) == [3, 9, 30]
    with pytest.raises(ExportError, match="no sglang equivalent"):
        to_engine_ids([0, 4, 5], "sglang", 8)  # the embedding output is no layer's output
    with pytest.raises(ExportError, match="no vllm equivalent"):
        to_engine_ids([2, 4, 8], "vllm", 8)  # the final norm's input is captured before no layer


def test_eagle3_exports_carry_each_engines_layer_ids(checkpoints, target, tmp_path):
    for engine, key, want in (
        ("vllm", "eagle_aux_hidden_state_layer_ids", [1, 2, 3]),
        ("sglang", "eagle_config", [0, 1, 2]),
    ):
        out, _, _ = export(checkpoints["eagle3"], engine, tmp_path / engine)
        config = json.loads((out / "config.json").read_text())
        ids = config[key] if engine == "vllm" else config[key]["eagle_aux_hidden_state_layer_ids"]
        assert ids == want
        info = json.loads((out / "draftsmith_export.json").read_text())
        assert info["layer_ids"]["canonical"] == [1, 2, 3]


# ---- every layout, re-read by a loader written from the engine's documentation ----------------------------


@pytest.mark.parametrize(
    "engine,prefix,cfg_key",
    [("sglang", "midlayer.", None), ("vllm", "layers.0.", "transformer_layer_config")],
)
def test_eagle3_export_computes_the_trained_logits(checkpoints, target, tmp_path, engine, prefix, cfg_key):
    out, _, _ = export(checkpoints["eagle3"], engine, tmp_path / engine)
    draft = _loaded("eagle3", checkpoints["eagle3"], target)
    g, ids = _inputs(target, width=3)
    with torch.no_grad():
        ours = draft.unroll(g, ids)[0][0]  # step 0, [T, Vd]
        theirs = ref.eagle3_step0(out, g[0], shift_left(ids)[0], target.embed_tokens.weight, prefix, cfg_key)
    target_ids = draft.to_target_ids(torch.arange(VD))
    torch.testing.assert_close(theirs[:, target_ids], ours, atol=1e-5, rtol=1e-5)
    assert torch.isinf(theirs).sum() == theirs.shape[0] * (target.vocab_size - VD)
    assert "embed_tokens.weight" not in load_file(str(out / "model.safetensors"))


def test_eagle3_with_the_qwen3_draft_layer_exports_to_vllm_only(checkpoints, target, tmp_path):
    """speculators' qwen3 layer: the vLLM export carries q/k norms under a qwen3 transformer_layer_config and
    computes the trained logits (the reference applies Qwen3's per-head norms); SGLang / hf refuse it."""
    ckpt = checkpoints["eagle3_qwen3"]
    out, _, built = export(ckpt, "vllm", tmp_path / "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["transformer_layer_config"]["model_type"] == "qwen3"
    weights = load_file(str(out / "model.safetensors"))
    assert {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"} <= set(weights)
    assert any("qwen3" in n for n in built.notes)
    draft = _loaded("eagle3", ckpt, target)
    g, ids = _inputs(target, width=3)
    with torch.no_grad():
        ours = draft.unroll(g, ids)[0][0]
        theirs = ref.eagle3_step0(
            out, g[0], shift_left(ids)[0], target.embed_tokens.weight, "layers.0.", "transformer_layer_config"
        )
    target_ids = draft.to_target_ids(torch.arange(VD))
    torch.testing.assert_close(theirs[:, target_ids], ours, atol=1e-5, rtol=1e-5)
    for engine in ("sglang", "hf"):
        with pytest.raises(ExportError, match=r"Llama draft layer.*draft.layer=qwen3.*--to vllm"):
            export(ckpt, engine, tmp_path / engine)
        assert not (tmp_path / engine).exists()


def test_a_two_layer_eagle3_exports_to_vllm_and_computes_the_trained_logits(checkpoints, target, tmp_path):
    """draft.num_layers=2: the later layer is vLLM's layers.1 (a plain Llama layer on H), the speculators config
    says two layers, and the reference running both layers from the export alone gives the trained logits;
    SGLang's one-midlayer EAGLE-3 is refused with nothing written."""
    ckpt = checkpoints["eagle3_two_layers"]
    out, _, _ = export(ckpt, "vllm", tmp_path / "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    weights = load_file(str(out / "model.safetensors"))
    assert weights["layers.1.self_attn.q_proj.weight"].shape[1] == target.hidden_size  # reads H, not 2H
    assert "layers.1.input_layernorm.weight" in weights and not any(n.startswith("later.") for n in weights)
    draft = _loaded("eagle3", ckpt, target)
    assert len(draft.later) == 1
    g, ids = _inputs(target, width=3)
    with torch.no_grad():
        ours = draft.unroll(g, ids)[0][0]
        theirs = ref.eagle3_step0(
            out, g[0], shift_left(ids)[0], target.embed_tokens.weight, "layers.0.", "transformer_layer_config"
        )
    target_ids = draft.to_target_ids(torch.arange(VD))
    torch.testing.assert_close(theirs[:, target_ids], ours, atol=1e-5, rtol=1e-5)
    for engine in ("sglang", "hf"):
        with pytest.raises(
            ExportError, match=r"one layer \(midlayer\).*has 2 \(draft.num_layers\).*--to vllm"
        ):
            export(ckpt, engine, tmp_path / engine)
        assert not (tmp_path / engine).exists()


@pytest.mark.parametrize("engine,fc_bias", [("sglang", True), ("sglang", False), ("vllm", False)])
def test_eagle1_export_computes_the_trained_logits(target, tmp_path, engine, fc_bias):
    ckpt = save_drafter(tmp_path / "ckpt", _eagle1(target, fc_bias), target.identity())
    out, _, _ = export(ckpt, engine, tmp_path / engine)
    draft = _loaded("eagle", ckpt, target)
    f, ids = _inputs(target)
    with torch.no_grad():
        ours = draft.logits(draft(f, ids))[0]
        theirs = ref.eagle1_step(out, f[0], ids[0], target.embed_tokens.weight, target.lm_head.weight)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    tensors = load_file(str(out / "model.safetensors"))
    # SGLang's EAGLE fc always has a bias (zero when none was trained); vLLM's never has one, and it prefixes
    # `Eagle` to the architecture name itself.
    assert ("fc.bias" in tensors) == (engine == "sglang")
    if engine == "sglang" and not fc_bias:
        assert not tensors["fc.bias"].any()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM" if engine == "vllm" else "LlamaForCausalLMEagle"]


def test_a_full_vocabulary_eagle3_ships_no_vocabulary_map_to_vllm(target, tmp_path):
    # vLLM creates draft_id_to_target_id only when draft_vocab_size != the target's, and refuses a d2t otherwise
    V = target.vocab_size
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3], ttt_steps=2), target.model.config, V)
    _randomize(draft, 6)
    ckpt = save_drafter(tmp_path / "ckpt", draft, target.identity())
    for engine in ("vllm", "sglang"):
        out, _, _ = export(ckpt, engine, tmp_path / engine)
        names = set(load_file(str(out / "model.safetensors")))
        assert ({"d2t", "t2d"} <= names) == (engine == "sglang")
    draft = _loaded("eagle3", ckpt, target)
    g, ids = _inputs(target, width=3)
    with torch.no_grad():
        ours = draft.unroll(g, ids)[0][0]
        theirs = ref.eagle3_step0(
            tmp_path / "vllm",
            g[0],
            shift_left(ids)[0],
            target.embed_tokens.weight,
            "layers.0.",
            "transformer_layer_config",
        )
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_a_trained_eagle1_bias_refuses_the_vllm_export_and_a_zero_one_is_dropped(target, tmp_path):
    draft = _eagle1(target, fc_bias=True)
    ckpt = save_drafter(tmp_path / "ckpt", draft, target.identity())
    _refused(ckpt, "vllm", tmp_path / "out", "vLLM's EAGLE-1 fc has no bias")
    with torch.no_grad():
        draft.fc.bias.zero_()
    zero = save_drafter(tmp_path / "zero", draft, target.identity())
    out, _, _ = export(zero, "vllm", tmp_path / "vllm")
    assert "fc.bias" not in load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize(
    "engine,layout", [("vllm", "vllm"), ("tgi", "fasterdecoding"), ("hf", "fasterdecoding")]
)
def test_medusa_export_computes_the_trained_logits(checkpoints, target, tmp_path, engine, layout):
    out, _, _ = export(checkpoints["medusa"], engine, tmp_path / engine)
    heads = _loaded("medusa", checkpoints["medusa"], target)
    h, _ = _inputs(target)
    with torch.no_grad():
        ours = heads(h)[:, 0]
        theirs = ref.medusa_heads(out, h[0], layout)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def deepseek(toy_tokenizer, tmp_path_factory) -> tuple[FrozenTarget, Path]:
    """A tiny DeepSeek-V3 target (MLA + MoE: engines serve its native nextn MTP) and an MTP checkpoint for it."""
    from draftsmith.models.target import TargetConfig
    from draftsmith.toy.tiny_targets import build_tiny_target

    path = tmp_path_factory.mktemp("deepseek")
    build_tiny_target("deepseek_v3", toy_tokenizer).save_pretrained(path)
    toy_tokenizer.save_pretrained(path)
    target = FrozenTarget.load(TargetConfig(path=str(path), dtype="float32"))
    return target, save_drafter(path.parent / "deepseek-mtp", _mtp(target), target.identity())


def test_mtp_is_refused_for_a_target_family_without_native_mtp(checkpoints, tmp_path):
    with pytest.raises(
        ExportError, match=r"no serving engine loads mtp drafters for a llama target.*DeepSeek-V3"
    ):
        export(checkpoints["mtp"], "vllm", tmp_path / "mtp")
    assert not (tmp_path / "mtp").exists()


def test_mtp_nextn_export_is_what_the_familys_own_loader_reads(deepseek, tmp_path):
    """Oracle: transformers' own DeepSeek-V3 loader (the on-disk names engines read, MoE experts per expert)
    reads each exported nextn block back into exactly the trained block."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    target, ckpt = deepseek
    out, passed, _ = export(ckpt, "vllm", tmp_path / "mtp")
    config = json.loads((out / "config.json").read_text())
    L = target.num_layers
    assert config["num_nextn_predict_layers"] == 2 and config["num_hidden_layers"] == L
    assert sum("bit-identical" in p for p in passed) == 4  # embedding and head of both modules
    exported = load_file(str(out / "model.safetensors"))
    assert any(".mlp.experts.0." in n for n in exported)  # per-expert, as DeepSeek checkpoints store them
    draft = _loaded("mtp", ckpt, target)
    own = {"enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"}
    for k in range(2):
        prefix = f"model.layers.{L + k}."
        block = {
            "model.layers.0." + n.removeprefix(prefix): t
            for n, t in exported.items()
            if n.startswith(prefix) and n.removeprefix(prefix).split(".")[0] not in own
        }
        one = AutoConfig.from_pretrained(str(target.name_or_path))
        one.num_hidden_layers, one.first_k_dense_replace = 1, 0
        one_dir = tmp_path / f"one-{k}"
        one.save_pretrained(one_dir)
        base = {n: t for n, t in target.model.state_dict().items() if ".layers." not in n}
        save_file({**base, **block}, str(one_dir / "model.safetensors"))
        loaded = AutoModelForCausalLM.from_pretrained(str(one_dir)).model.layers[0].state_dict()
        trained = draft.layers[k].block.state_dict()
        assert set(loaded) == set(trained)
        for name, tensor in trained.items():
            assert torch.equal(loaded[name], tensor), name
        assert torch.equal(exported[prefix + "eh_proj.weight"], draft.layers[k].eh_proj.weight)


def test_exports_copy_positions_and_rope_from_the_target(checkpoints, target, tmp_path):
    out, _, _ = export(checkpoints["eagle3"], "sglang", tmp_path / "sglang")
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == target.model.config.max_position_embeddings == 512
    assert config["rope_theta"] == target.model.config.rope_parameters["rope_theta"]
    out, _, _ = export(checkpoints["eagle3"], "vllm", tmp_path / "vllm")
    layer = json.loads((out / "config.json").read_text())["transformer_layer_config"]
    assert layer["max_position_embeddings"] == 512 and layer["num_hidden_layers"] == 1
    assert layer["rope_parameters"] == target.model.config.rope_parameters


def test_unsupported_engine_pairs_name_the_alternatives(checkpoints, tmp_path):
    with pytest.raises(ExportError, match="tgi does not serve eagle3 drafters; export eagle3 with --to hf"):
        export(checkpoints["eagle3"], "tgi", tmp_path / "x")
    with pytest.raises(ExportError, match="sglang does not serve medusa"):
        export(checkpoints["medusa"], "sglang", tmp_path / "x")


# ---- the silent-failure classes: a broken checkpoint is refused and nothing is written ---------------------


def _broken(ckpt: Path, tmp_path: Path, state_edit=None, config_edit=None) -> Path:
    copy = tmp_path / ("broken-" + ckpt.name)
    shutil.copytree(ckpt, copy)
    if state_edit is not None:
        state = load_file(str(copy / "model.safetensors"))
        state_edit(state)
        save_file(state, str(copy / "model.safetensors"))
    config = json.loads((copy / "config.json").read_text())
    if config_edit is not None:
        config_edit(config)
    # As a buggy trainer would write it: consistent hashes, so the export's own checks are what refuse it.
    from draftsmith.runtime.files import record_hashes

    config["weights_sha256"] = record_hashes(copy, ["model.safetensors"])
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _refused(ckpt: Path, engine: str, out: Path, match: str, target: str | None = None) -> None:
    with pytest.raises(ExportError, match=match):
        export(ckpt, engine, out, target)
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def test_missing_d2t_for_a_pruned_vocabulary_is_refused(checkpoints, tmp_path):
    # NeMo-Automodel#2447: without d2t, vLLM reads draft id i as target id i.
    broken = _broken(checkpoints["eagle3"], tmp_path, state_edit=lambda s: s.pop("d2t"))
    for engine in ("vllm", "sglang"):
        _refused(
            broken, engine, tmp_path / engine, r"no d2t: the draft vocabulary has 100 of the target's 400"
        )


def test_a_vocabulary_map_that_disagrees_with_t2d_is_refused(checkpoints, tmp_path):
    # verl-SpeCo#66: a meaningless slice (d2t all zero: the first 100 target ids) that t2d contradicts.
    broken = _broken(checkpoints["eagle3"], tmp_path, state_edit=lambda s: s["d2t"].zero_())
    _refused(broken, "vllm", tmp_path / "out", "t2d does not mark exactly the target ids of d2t")


def test_a_wrong_max_position_embeddings_is_refused(checkpoints, tmp_path):
    # SpecForge#271: max_position_embeddings 2048 in the draft config under a longer-context target.
    def edit(config):
        config["target_config"]["max_position_embeddings"] = 2048

    for kind in ("eagle3", "eagle"):
        broken = _broken(checkpoints[kind], tmp_path / kind, config_edit=edit)
        _refused(
            broken, "vllm", tmp_path / kind / "out", r"max_position_embeddings 2048 in the checkpoint, 512"
        )


def test_a_wrong_rope_theta_is_refused(checkpoints, tmp_path):
    def edit(config):
        config["target_config"]["rope_parameters"]["rope_theta"] = 500000.0

    broken = _broken(checkpoints["eagle3"], tmp_path, config_edit=edit)
    _refused(broken, "sglang", tmp_path / "out", "rope")


def test_an_embed_tokens_that_is_not_the_targets_is_refused(checkpoints, target, tmp_path):
    # TorchSpec#38: a random embed_tokens saved with the draft.
    def edit(state):
        state["embed_tokens.weight"] = torch.randn(target.vocab_size, target.hidden_size)

    broken = _broken(checkpoints["eagle3"], tmp_path, state_edit=edit)
    for engine in ("vllm", "sglang"):
        _refused(
            broken, engine, tmp_path / engine, "embed_tokens.weight is not bit-identical to the target's"
        )


def test_an_embed_tokens_equal_to_the_targets_is_accepted(checkpoints, target, tmp_path):
    def edit(state):
        state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()

    broken = _broken(checkpoints["eagle3"], tmp_path, state_edit=edit)
    _, passed, _ = export(broken, "vllm", tmp_path / "out")
    assert "embed_tokens.weight is bit-identical to the target's embedding" in passed


def test_mtp_shared_tensors_that_are_not_the_targets_are_refused(deepseek, tmp_path):
    from draftsmith.ship.export import check_target, read_source
    from draftsmith.ship.layouts.mtp import mtp_native

    target, ckpt = deepseek
    info = TargetInfo(str(target.name_or_path))
    source = read_source(ckpt)
    check_target(source, info)
    built, spec = mtp_native(source, info, "hf")
    validate(built, spec, info)  # as built: passes
    L = target.num_layers
    built.tensors[f"model.layers.{L + 1}.embed_tokens.weight"] = torch.randn(
        target.vocab_size, target.hidden_size
    )
    with pytest.raises(ExportError, match=rf"model.layers.{L + 1}.embed_tokens.weight is not bit-identical"):
        validate(built, spec, info)


def test_a_dropped_fc_bias_is_refused(target, tmp_path):
    # vllm#11126: the fc bias that the engine's module has but the export lacks.
    ckpt = save_drafter(tmp_path / "ckpt", _eagle1(target, fc_bias=True), target.identity())
    broken = _broken(ckpt, tmp_path, state_edit=lambda s: s.pop("fc.bias"))
    _refused(broken, "sglang", tmp_path / "out", "draft.fc_bias=true but has no fc.bias")


def test_medusa_biases_without_the_flag_that_loads_them_are_refused(checkpoints, target, tmp_path):
    from draftsmith.ship.export import read_source
    from draftsmith.ship.layouts.medusa import medusa_vllm

    info = TargetInfo(str(target.name_or_path))
    built, spec = medusa_vllm(read_source(checkpoints["medusa"]), info, "vllm")
    del built.config["medusa_fc_bias"]  # vLLM would build bias-free blocks and drop the trained biases
    with pytest.raises(ExportError, match="lacks 'medusa_fc_bias'"):
        validate(built, spec, info)


def test_layer_ids_in_the_wrong_convention_are_refused(checkpoints, target, tmp_path):
    from draftsmith.ship.export import read_source
    from draftsmith.ship.layouts.eagle import eagle3_sglang

    info = TargetInfo(str(target.name_or_path))
    built, spec = eagle3_sglang(read_source(checkpoints["eagle3"]), info, "sglang")
    built.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # canonical, not SGLang's
    with pytest.raises(ExportError, match="eagle_aux_hidden_state_layer_ids=\\[1, 2, 3\\]"):
        validate(built, spec, info)
    # A tap the engine cannot name: canonical 0 (the embedding output) has no SGLang id.
    broken = _broken(
        checkpoints["eagle3"], tmp_path, config_edit=lambda c: c.update(feature_layers=[0, 2, 3])
    )
    _refused(broken, "sglang", tmp_path / "out", "no sglang equivalent")


def test_tensors_the_engine_does_not_know_are_refused(checkpoints, target, tmp_path):
    # e.g. a Qwen3 q_norm that the engines' Llama draft layer would skip silently.
    def edit(state):
        state["layer.self_attn.q_norm.weight"] = torch.ones(8)

    broken = _broken(checkpoints["eagle3"], tmp_path, state_edit=edit)
    _refused(broken, "vllm", tmp_path / "out", r"does not know .*q_norm")


def test_non_finite_weights_and_a_foreign_target_are_refused(checkpoints, target, tmp_path):
    broken = _broken(
        checkpoints["medusa"],
        tmp_path / "nan",
        state_edit=lambda s: s["heads.0.0.linear.weight"].fill_(float("nan")),
    )
    _refused(broken, "vllm", tmp_path / "nan" / "out", "NaN")
    foreign = _broken(
        checkpoints["medusa"],
        tmp_path / "foreign",
        config_edit=lambda c: c["target"].update(vocab_size=32000),
    )
    _refused(foreign, "vllm", tmp_path / "foreign" / "out", "trained for another target")


def test_the_command_prints_checks_and_serving_commands(checkpoints, tmp_path, capsys):
    assert main([str(checkpoints["medusa"]), "--to", "vllm", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "exported medusa-vllm" in out and "ok  " in out and '"method": "medusa"' in out
    from draftsmith.scripts.cli import main as cli

    assert cli(["export", str(checkpoints["eagle3"]), "--to", "tgi", "--out", str(tmp_path / "x")]) == 1
    assert "error: tgi does not serve eagle3" in capsys.readouterr().err


# ---- the closed loop: speculators' own EAGLE-3 classes load the vLLM export -------------------------------


def _speculators_python() -> str | None:
    import importlib.util

    if importlib.util.find_spec("speculators") is not None:
        return sys.executable
    env = os.environ.get("DRAFTSMITH_SPECULATORS_PYTHON")
    return env if env and Path(env).is_file() else None


@pytest.mark.skipif(
    _speculators_python() is None,
    reason="speculators is not importable here and DRAFTSMITH_SPECULATORS_PYTHON names no python that has it "
    "(install recipe: bench/bench_peers.py)",
)
def test_closed_loop_speculators_loads_the_vllm_export(checkpoints, target, tmp_path):
    from draftsmith.engines.check_engine_load import run_closed_loop

    out, _, _ = export(checkpoints["eagle3"], "vllm", tmp_path / "vllm")
    report = run_closed_loop(str(checkpoints["eagle3"]), str(out), str(_speculators_python()), tokens=24)
    assert report["ok"] and report["max_abs_diff"] <= 1e-4 and report["steps"] == 3, report
    # Negative control: swap the two input norms in the export; the engine's forward must disagree.
    state = load_file(str(out / "model.safetensors"))
    a, b = "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight"
    state[a], state[b] = state[b], state[a]
    save_file(state, str(out / "model.safetensors"))
    report = run_closed_loop(str(checkpoints["eagle3"]), str(out), str(_speculators_python()), tokens=24)
    assert not report["ok"] and report["max_abs_diff"] > 1e-3


def test_another_target_of_the_same_shapes_and_tokenizer_is_refused(checkpoints, target, tmp_path):
    """A fine-tune of the training target (same sizes, same tokenizer, other weights) is caught by the weights
    fingerprint, in export (--target) and in eval; the same weights in bfloat16 are still the same target."""
    import copy as copy_module

    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.target import FrozenTarget, TargetConfig

    tuned = copy_module.deepcopy(target.model)
    with torch.no_grad():
        tuned.get_output_embeddings().weight.mul_(1.01)
    other = tmp_path / "finetune"
    tuned.save_pretrained(other)
    target.tokenizer.save_pretrained(other)
    _refused(
        checkpoints["eagle3"],
        "vllm",
        tmp_path / "out",
        r"trained for another target: weights_sha256",
        str(other),
    )
    finetune = FrozenTarget.load(TargetConfig(path=str(other), dtype="float32"))
    with pytest.raises(ValueError, match=r"weights_sha256: trained for"):
        load_drafter_spec(str(checkpoints["eagle3"]), finetune)
    in_bf16 = FrozenTarget.load(TargetConfig(path=target.name_or_path, dtype="bfloat16"))
    assert in_bf16.identity()["weights_sha256"] == target.identity()["weights_sha256"]


def test_an_export_into_a_directory_another_writer_holds_is_refused(checkpoints, tmp_path):
    """Exports lock beside their directory (which must hold only the export); a held lock refuses, in one line,
    and nothing is written."""
    from draftsmith.runtime.run_lock import DirectoryBusy, RunLock

    holder = RunLock(tmp_path, "export", name=".out.draftsmith.lock").acquire()
    with pytest.raises(DirectoryBusy, match=r"in use by export, pid \d+"):
        export(checkpoints["eagle3"], "vllm", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    holder.release()
    export(checkpoints["eagle3"], "vllm", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the lock is gone with the export


@pytest.mark.parametrize(("kind", "method"), [("eagle3", "eagle3"), ("eagle", "eagle"), ("medusa", "medusa")])
def test_vllm_exports_record_the_speculative_config_their_serve_command_uses(
    checkpoints, target, tmp_path, kind, method
):
    ckpt = checkpoints[kind]
    if kind == "eagle":  # vLLM's EAGLE-1 has no fc bias: a bias-free one
        ckpt = save_drafter(tmp_path / "eagle1", _eagle1(target, fc_bias=False), target.identity())
    out, _, built = export(ckpt, "vllm", tmp_path / kind)
    info = json.loads((out / "draftsmith_export.json").read_text())
    spec = info["speculative_config"]
    assert spec["method"] == method and spec["model"] == "{dir}" and spec["num_speculative_tokens"] >= 1
    assert any(json.dumps(spec) in cmd for cmd in info["serve"])  # one source for both
    sglang = export(checkpoints["eagle3"], "sglang", tmp_path / "sglang")[2]
    assert sglang.speculative is None
