import json
from typing import Any

import pytest
import torch

from draftsmith.models.checkpoint import load_drafter, read_drafter_config, save_drafter
from draftsmith.models.families import FAMILIES, drafter_class, index
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.target import FrozenTarget


def test_roundtrip_and_target_check(tmp_path, tiny_random_target, toy_tokenizer):
    t = tiny_random_target
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), t.hidden_size, t.vocab_size)
    first: Any = heads.heads[0]  # nn.Sequential(ResBlock, ..., Linear)
    torch.nn.init.normal_(first[0].linear.weight)
    out = save_drafter(tmp_path / "final", heads, t.identity(), extra={"training": {"steps": 3}})
    cfg = read_drafter_config(out)
    assert cfg["kind"] == "medusa" and cfg["feature_layers"] == ["final"] and cfg["training"]["steps"] == 3
    assert cfg["target"]["tokenizer_sha256"] == t.identity()["tokenizer_sha256"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    loaded, _ = load_drafter(out, target=t)
    for (k, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)

    # A target with another hidden size is refused with a message naming the difference.
    from conftest import make_tiny_llama

    other = FrozenTarget(make_tiny_llama(len(toy_tokenizer), hidden=48), toy_tokenizer, "other")
    with pytest.raises(ValueError, match="hidden_size: trained for 32, got 48"):
        load_drafter(out, target=other)


def test_save_is_atomic_replace(tmp_path, tiny_random_target):
    t = tiny_random_target
    heads = MedusaHeads(MedusaConfig(num_heads=1), t.hidden_size, t.vocab_size)
    save_drafter(tmp_path / "final", heads, t.identity())
    save_drafter(tmp_path / "final", heads, t.identity())  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a draftsmith drafter checkpoint"):
        read_drafter_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"kind": "medusa"}))
    with pytest.raises(ValueError, match="'drafter'"):
        read_drafter_config(tmp_path)


def test_registry():
    assert drafter_class("medusa") is MedusaHeads
    with pytest.raises(
        ValueError, match="known kinds: dflash, draft_lm, eagle, eagle3, medusa, mtp, ngram, peagle"
    ):
        drafter_class("nope")
    with pytest.raises(ValueError, match="registered twice"):
        index((FAMILIES["medusa"], FAMILIES["medusa"]))


def test_eagle3_round_trip_keeps_vocab_map_and_reattaches_the_target(tiny_random_target, tmp_path):
    from draftsmith.models.eagle import EagleConfig
    from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map

    target = tiny_random_target
    torch.manual_seed(0)
    draft = Eagle3Draft(EagleConfig(version=3, feature_layers=[1, 2, 3]), target.model.config, 64)
    draft.set_vocab_map(*build_vocab_map(torch.arange(target.vocab_size).flip(0), 64))
    save_drafter(tmp_path / "e3", draft, target.identity())
    loaded, config = load_drafter(tmp_path / "e3", target)
    assert (
        config["kind"] == "eagle3"
        and config["feature_layers"] == [1, 2, 3]
        and config["draft_vocab_size"] == 64
    )
    assert "embed_tokens.weight" not in loaded.state_dict()  # the target's weights are never duplicated
    for k, v in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert loaded.frozen.lm_head is target.head  # reattached on load


def _saved_heads(t, path):
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), t.hidden_size, t.vocab_size)
    return save_drafter(path, heads, t.identity())


def test_one_flipped_byte_in_the_weights_is_refused_by_load_export_and_eval(tmp_path, tiny_random_target):
    """config.json records the weights' sha256; loading (eval, push) and export check it."""
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.runtime.files import DamagedFile
    from draftsmith.ship.export import read_source

    out = _saved_heads(tiny_random_target, tmp_path / "final")
    weights = out / "model.safetensors"
    assert (
        read_drafter_config(out)["weights_sha256"]["model.safetensors"]
        == __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
    )
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40  # a flipped bit inside a tensor: still a valid safetensors file
    weights.write_bytes(bytes(data))
    for load in (
        lambda: load_drafter(out),
        lambda: read_source(out),
        lambda: load_drafter_spec(str(out), tiny_random_target),
    ):
        with pytest.raises(
            DamagedFile, match=r"model.safetensors does not match the sha256 recorded in .*config.json"
        ):
            load()


def test_damaged_or_mismatched_checkpoint_files_name_the_file(tmp_path, tiny_random_target):
    from draftsmith.runtime.errors import UserError
    from draftsmith.runtime.files import DamagedFile

    out = _saved_heads(tiny_random_target, tmp_path / "a")
    config = out / "config.json"
    good = config.read_text()
    config.write_text(good[:-40])  # truncated JSON
    with pytest.raises(DamagedFile, match=r"a/config.json:\d+:\d+: not valid JSON"):
        load_drafter(out)
    # Weights truncated, with the record of their hash removed: the safetensors reader itself fails.
    config.write_text(json.dumps({k: v for k, v in json.loads(good).items() if k != "weights_sha256"}))
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:100])
    with pytest.raises(DamagedFile, match=r"a/model.safetensors is not a readable safetensors file"):
        load_drafter(out)
    # Weights of another drafter under this config (three heads' weights, a two-head config).
    other = MedusaHeads(
        MedusaConfig(num_heads=3, num_layers=1), tiny_random_target.hidden_size, tiny_random_target.vocab_size
    )
    b = save_drafter(tmp_path / "b", other, tiny_random_target.identity())
    (out / "model.safetensors").write_bytes((b / "model.safetensors").read_bytes())
    with pytest.raises(
        UserError, match=r"does not hold the weights of the medusa drafter its config.json describes"
    ):
        load_drafter(out)


def test_a_training_checkpoint_passed_as_a_drafter_points_to_final(tmp_path):
    from draftsmith.runtime.errors import UserError

    ckpt = tmp_path / "run" / "checkpoint-20"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    with pytest.raises(UserError, match=r"is a training checkpoint .*--resume.*run/final"):
        read_drafter_config(ckpt)
