import pytest
import torch

from draftsmith.models.identity import check_target_identity
from draftsmith.models.target import FrozenTarget


def test_canonical_ids_match_output_hidden_states(tiny_random_target):
    t = tiny_random_target
    L = t.num_layers
    x = torch.randint(0, t.vocab_size, (2, 9))
    mask = torch.ones_like(x)
    mask[1, 6:] = 0  # right padding on one row
    ref = t.model(input_ids=x, attention_mask=mask, output_hidden_states=True)
    ids = [0, L // 2, L - 1, "final"]
    feats, logits = t.forward(x, mask, layer_ids=ids, return_logits=True)
    for lid in (0, L // 2, L - 1):
        torch.testing.assert_close(feats[lid], ref.hidden_states[lid], rtol=0, atol=0)
    torch.testing.assert_close(feats["final"], ref.hidden_states[-1], rtol=0, atol=0)
    torch.testing.assert_close(logits, ref.logits)


def test_id_L_is_the_pre_norm_output_of_the_last_layer(tiny_random_target):
    t = tiny_random_target
    x = torch.randint(0, t.vocab_size, (1, 7))
    feats, logits = t.forward(x, layer_ids=[t.num_layers, "final"])
    assert logits is None
    # The final norm applied to id L is the post-norm state; and id L differs from "final".
    torch.testing.assert_close(t.decoder.norm(feats[t.num_layers]), feats["final"])
    assert not torch.allclose(feats[t.num_layers], feats["final"])


def test_target_is_frozen_and_bad_ids_are_rejected(tiny_random_target):
    t = tiny_random_target
    assert not any(p.requires_grad for p in t.model.parameters())
    assert not t.model.training
    with pytest.raises(ValueError, match="out of range"):
        t.forward(torch.zeros(1, 3, dtype=torch.long), layer_ids=[t.num_layers + 1])


def test_identity_and_mismatch(tiny_random_target, toy_tokenizer):
    ident = tiny_random_target.identity()
    assert (
        ident["vocab_size"] == len(toy_tokenizer) and ident["num_layers"] == 4 and ident["hidden_size"] == 32
    )
    check_target_identity(ident, dict(ident), "drafter")  # same target passes
    other = dict(ident, hidden_size=64, tokenizer_sha256="0" * 64)
    with pytest.raises(ValueError, match="hidden_size: trained for 32, got 64") as err:
        check_target_identity(ident, other, "drafter X")
    assert "tokenizer_sha256" in str(err.value)


def test_load_from_local_directory(tmp_path, tiny_random_target):
    from draftsmith.models.target import TargetConfig

    tiny_random_target.model.save_pretrained(tmp_path)
    tiny_random_target.tokenizer.save_pretrained(tmp_path)
    loaded = FrozenTarget.load(TargetConfig(path=str(tmp_path)))
    assert loaded.identity() == {**tiny_random_target.identity(), "name_or_path": str(tmp_path)}
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        FrozenTarget.load(TargetConfig(path=str(tmp_path / "missing")))


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_at_load(tmp_path, tiny_random_target):
    """It used to pass until an IndexError deep in the first forward."""
    import copy

    from draftsmith.models.target import TargetConfig

    tok = copy.deepcopy(tiny_random_target.tokenizer)  # the fixture is shared: never add tokens to it
    tiny_random_target.model.save_pretrained(tmp_path)
    tok.add_tokens([f"<extra_{i}>" for i in range(tiny_random_target.vocab_size - len(tok) + 1)])
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"tokenizer has {len(tok)} tokens but the model's embedding only"):
        FrozenTarget.load(TargetConfig(path=str(tmp_path)))


AUTO_MAP = {
    "AutoConfig": "configuration_custom.CustomConfig",
    "AutoModelForCausalLM": "modeling_custom.CustomLM",
}


def _custom_target(path, tiny_random_target, **config):
    """A saved target whose config.json is edited as a model shipping its own modeling code would have it."""
    import json

    tiny_random_target.model.save_pretrained(path)
    tiny_random_target.tokenizer.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(saved | config))
    return str(path)


def _load_message(path: str, **settings) -> str:
    from draftsmith.models.target import TargetConfig

    with pytest.raises(ValueError) as info:
        FrozenTarget.load(TargetConfig(path=path, **settings))
    message = str(info.value)
    assert message.startswith(f"could not load target {path!r}: ") and "\n" not in message
    return message


def test_a_target_with_its_own_modeling_code_names_the_setting_to_change(
    tmp_path, tiny_random_target, monkeypatch
):
    """transformers refuses before reading any code or weights (no network: a local directory; offline set so
    a regression could not reach out), in a message of several lines naming its own argument only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _custom_target(tmp_path, tiny_random_target, model_type="draftsmith_custom", auto_map=AUTO_MAP)
    message = _load_message(path)
    from draftsmith.models.target import TargetConfig

    assert "ships its own modeling code" in message and "target.trust_remote_code=true" in message
    # Allowed, the missing code file is named instead (and the setting is not suggested again).
    with pytest.raises(FileNotFoundError, match="configuration_custom.py") as info:
        FrozenTarget.load(TargetConfig(path=path, trust_remote_code=True))
    assert "trust_remote_code=true" not in str(info.value) and "\n" not in str(info.value)


def test_an_architecture_transformers_does_not_know_is_one_line(tmp_path, tiny_random_target, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = _load_message(_custom_target(tmp_path, tiny_random_target, model_type="draftsmith_custom"))
    assert "model type `draftsmith_custom`" in message and "does not recognize this architecture" in message
    assert message.endswith(
        "Upgrade transformers, or set target.trust_remote_code=true if it ships modeling code"
    )


def _ops(fn) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


@pytest.mark.parametrize("batch", [1, 3])
def test_the_head_folds_a_last_position_slice_into_one_product(tiny_random_target, batch):
    """The head of a loaded target takes `hidden[:, -1:]` (generate's prefill) as one matrix product, the same
    values as the plain module: without the hook matmul expands the weight per row and copies it (`bmm`)."""
    t = tiny_random_target
    head = t.model.get_output_embeddings()
    hidden = torch.randn(batch, 7, t.hidden_size)
    last = hidden[:, -1:, :]
    plain = torch.nn.functional.linear(last.reshape(batch, -1), head.weight)[:, None, :]  # the oracle
    assert "aten::bmm" in _ops(lambda: torch.nn.functional.linear(last, head.weight))  # the cost it avoids
    assert "aten::bmm" not in _ops(lambda: head(last))
    torch.testing.assert_close(head(last), plain, rtol=0, atol=1e-6)
    assert head(last).shape == (batch, 1, t.vocab_size)
    seen = []  # what the head's forward receives, after the hook (pre-hooks run in the order registered)
    check = head.register_forward_pre_hook(
        lambda module, args: seen.append((args[0].shape, args[0].stride()))
    )
    try:
        logits = t.model(input_ids=torch.randint(0, t.vocab_size, (batch, 7)), logits_to_keep=1).logits
    finally:
        check.remove()
    assert logits.shape == (batch, 1, t.vocab_size)
    assert seen == [((batch, 1, t.hidden_size), (t.hidden_size, t.hidden_size, 1))]


def test_the_head_hook_leaves_dense_inputs_alone():
    from draftsmith.models.target_parts import foldable_input

    linear = torch.nn.Linear(4, 6, bias=False)
    dense = torch.randn(2, 5, 4)
    assert foldable_input(linear, (dense,)) is None
    assert foldable_input(linear, (dense[0],)) is None  # 2-D: always one product
    assert foldable_input(linear, (dense[:1, 2:3],)) is not None  # size-1 dims whose strides still fail
    hooked = foldable_input(linear, (dense[:, -1:],))
    assert hooked is not None
    (copied,) = hooked
    assert copied.stride() == (4, 4, 1)
    torch.testing.assert_close(copied, dense[:, -1:], rtol=0, atol=0)
