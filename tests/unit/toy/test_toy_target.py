"""The toy-target builder: deterministic, loadable, learning, safe with existing directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import draftsmith.toy.build as cli
from draftsmith.data.stdlib_corpus import stdlib_conversations
from draftsmith.toy.presets import DRAFT_PRESETS, PRESETS, ToyPreset
from draftsmith.toy.target import _batches, _load_corpus, _lr_lambda, build_toy_target, greedy_samples
from draftsmith.toy.tokenizer import END_TOKEN

STEPS = 16
BUILD_KEYS = {
    "preset",
    "preset_values",
    "corpus",
    "seed",
    "num_parameters",
    "vocab_size",
    "num_train_conversations",
    "num_heldout_conversations",
    "train_tokens_seen",
    "wall_time_s",
    "train_loss",
    "heldout_loss",
    "python_version",
    "torch_version",
    "transformers_version",
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toy")
    out = {"a": root / "a", "b": root / "b", "c": root / "c"}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build_toy_target("tiny", out[name], seed=seed, max_steps=STEPS, progress=False)
    return out


def test_same_seed_is_bit_identical_and_another_seed_differs(builds: dict[str, Path]) -> None:
    weights = {k: (p / "model.safetensors").read_bytes() for k, p in builds.items()}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]
    assert (builds["a"] / "tokenizer.json").read_bytes() == (builds["c"] / "tokenizer.json").read_bytes()


def test_build_loads_as_a_hugging_face_model(builds: dict[str, Path]) -> None:
    info = json.loads((builds["a"] / "build.json").read_text())
    assert set(info) >= BUILD_KEYS
    tokenizer = AutoTokenizer.from_pretrained(builds["a"])
    model = AutoModelForCausalLM.from_pretrained(builds["a"])
    assert info["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert info["vocab_size"] == len(tokenizer) == model.config.vocab_size == PRESETS["tiny"].vocab_size
    assert model.config.num_hidden_layers == PRESETS["tiny"].num_layers
    assert info["train_tokens_seen"] == STEPS * PRESETS["tiny"].batch_size * PRESETS["tiny"].seq_len
    assert info["preset_values"]["max_steps"] == STEPS and info["corpus"] == ["stdlib"]
    assert info["num_heldout_conversations"] == len(stdlib_conversations("heldout"))
    end = tokenizer.convert_tokens_to_ids(END_TOKEN)
    assert tokenizer.eos_token == END_TOKEN
    assert model.config.eos_token_id == GenerationConfig.from_pretrained(builds["a"]).eos_token_id == end
    assert model.config.pad_token_id == tokenizer.pad_token_id != end
    messages = [{"role": "user", "content": "def f():"}, {"role": "assistant", "content": "    pass"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "<|user|>def f():<|end|><|assistant|>    pass<|end|>"


def test_loss_goes_down_from_uniform(builds: dict[str, Path]) -> None:
    info = json.loads((builds["a"] / "build.json").read_text())
    # A freshly initialised LM (std 0.02) predicts almost uniformly: loss ~ ln(V).
    assert info["initial_train_loss"] == pytest.approx(math.log(info["vocab_size"]), abs=0.1)
    assert info["train_loss"] < info["initial_train_loss"] - 0.4
    assert info["heldout_loss"] < info["initial_train_loss"] - 0.4


def test_greedy_samples_match_a_cache_free_argmax_loop(builds: dict[str, Path]) -> None:
    samples = greedy_samples(builds["a"], n=2, max_new_tokens=6)
    tokenizer = AutoTokenizer.from_pretrained(builds["a"])
    model = AutoModelForCausalLM.from_pretrained(builds["a"]).eval()
    for (prompt, completion), conv in zip(samples, stdlib_conversations("heldout")[:2], strict=True):
        assert prompt == conv["messages"][0]["content"]
        text = tokenizer.apply_chat_template(
            [conv["messages"][0]], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        new: list[int] = []
        with torch.no_grad():
            for _ in range(6):
                nxt = int(model(input_ids=ids).logits[0, -1].argmax())
                if nxt == tokenizer.eos_token_id:
                    break
                new.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        assert completion == tokenizer.decode(new, skip_special_tokens=True)
    assert len(samples) == 2


def test_existing_out_dir_is_refused_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "target"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="--force"):
        build_toy_target("tiny", out, max_steps=1, progress=False)
    assert cli.main(["--preset", "tiny", "--out", str(out), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--force" in err and "\n" not in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="tiny, small"):
        build_toy_target("huge", tmp_path / "other")


def test_file_corpora_hold_out_records_deterministically(tmp_path: Path) -> None:
    convs = stdlib_conversations("train")[:200]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": c["messages"]}) + "\n" for c in convs))
    doc = tmp_path / "doc.txt"
    doc.write_text("First document.\n\nSecond document,\nwrapped.\n")
    first = _load_corpus([str(chat), str(doc)])
    assert _load_corpus([str(chat), str(doc)]) == first
    texts = first.train_texts + first.heldout_texts
    assert len(texts) == 202 and 0 < len(first.heldout_texts) < 30
    assert all(t.endswith(END_TOKEN) for t in texts)
    assert {"First document.<|end|>", "Second document,\nwrapped.<|end|>"} <= set(texts)
    user, answer = convs[0]["messages"]
    assert f"<|user|>{user['content']}<|end|><|assistant|>{answer['content']}<|end|>" in texts

    info = build_toy_target("tiny", tmp_path / "out", corpus=[str(chat)], max_steps=2, progress=False)
    assert info["corpus"] == [str(chat)]
    assert info["num_train_conversations"] + info["num_heldout_conversations"] == 200
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        _load_corpus([str(tmp_path / "missing.jsonl")])


def test_presets_support_eagle3_taps() -> None:
    for name, preset in PRESETS.items():
        if name in DRAFT_PRESETS:
            continue
        layers = preset.num_layers
        assert 2 < layers // 2 < layers - 3  # EAGLE-3's default taps 2, L//2, L-3 are distinct, ascending
    with pytest.raises(ValueError, match="even size"):
        ToyPreset(1024, 66, 8, 2, 128, 64, 2, 10, 1e-3, 1)


def test_lr_schedule_warms_up_then_follows_the_cosine() -> None:
    cfg = ToyPreset(1024, 64, 8, 4, 128, 64, 2, max_steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    f = _lr_lambda(cfg)
    assert [f(0), f(4), f(9), f(10)] == pytest.approx([0.1, 0.5, 1.0, 1.0])
    assert f(60) == pytest.approx(0.55)  # halfway through the decay: (1 + 0.1) / 2
    assert f(110) == pytest.approx(0.1)


def test_batches_visit_every_block_once_per_epoch() -> None:
    blocks = torch.arange(20).view(10, 2)  # block i = [2i, 2i + 1]
    stream = _batches(blocks, 3, torch.Generator().manual_seed(0))
    rows = torch.cat([next(stream) for _ in range(10)])  # 30 rows = 3 epochs
    assert torch.equal(rows[:, 1] - rows[:, 0], torch.ones(30, dtype=torch.long))  # whole blocks
    for epoch in range(3):
        assert sorted((rows[epoch * 10 : (epoch + 1) * 10, 0] // 2).tolist()) == list(range(10))
