import json

import pytest
import torch

from draftsmith.models.checkpoint import load_drafter, read_drafter_config, save_drafter
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.registry import drafter_class, register_drafter
from draftsmith.models.target import FrozenTarget


def test_roundtrip_and_target_check(tmp_path, tiny_random_target, toy_tokenizer):
    t = tiny_random_target
    heads = MedusaHeads(MedusaConfig(num_heads=2, num_layers=1), t.hidden_size, t.vocab_size)
    torch.nn.init.normal_(heads.heads[0][0].linear.weight)
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
    with pytest.raises(ValueError, match="known kinds: eagle, eagle3, medusa"):
        drafter_class("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_drafter("medusa")(type("Other", (), {}))


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
