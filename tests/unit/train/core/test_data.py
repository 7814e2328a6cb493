"""The training data pipeline: config checks, truncation/drop accounting, the held-out split, collate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftsmith.data.chat_render import render_conversation
from draftsmith.data.conversations import read_conversations
from draftsmith.scripts.data.inspect import highlight_trained, inspect_data
from draftsmith.train.core.data import (
    DataConfig,
    DataStats,
    build_datasets,
    collate,
    split_heldout,
)


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def pairs(n: int, prefix: str = "q") -> list[dict]:
    return [
        {"question": f"{prefix}{i}: what is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}."} for i in range(n)
    ]


def test_config_defaults_help_and_validation() -> None:
    from dataclasses import fields

    cfg = DataConfig()
    assert cfg.train == ["stdlib:train"] and cfg.eval == [] and cfg.format == "auto"
    assert (cfg.eval_fraction, cfg.max_len, cfg.max_samples, cfg.eval_max_samples) == (0.05, 1024, None, 200)
    assert all(f.metadata.get("help") for f in fields(DataConfig))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"eval_fraction": -0.1}, "eval_fraction"),
        ({"max_len": 1}, "max_len"),
        ({"format": "csv"}, "format"),
        ({"train": []}, "data.train"),
        ({"max_samples": 0}, "max_samples"),
        (
            {"train": "data.jsonl"},
            r"data.train is a string; expected a list of sources, e.g. \['data.jsonl'\]",
        ),
    ]
    for kwargs, needle in cases:
        with pytest.raises(ValueError, match=needle):
            DataConfig(**kwargs)


def test_alpaca_record_through_the_pipeline(toy_tokenizer, tmp_path: Path) -> None:
    output = "1. Sleep.\n2. Eat well.\n3. Move every day!"
    path = tmp_path / "alpaca.jsonl"
    record = {"instruction": "Give three tips for staying healthy.", "input": "", "output": output}
    cfg = DataConfig(train=[write_jsonl(path, [record])], eval_fraction=0.0)
    bundle = build_datasets(cfg, toy_tokenizer, seed=0, progress=False)
    sample = bundle.train[0]
    assert sample["input_ids"].dtype == torch.long and sample["loss_mask"].dtype == torch.bool
    assert toy_tokenizer.decode(sample["input_ids"][sample["loss_mask"]]) == output + "<|end|>"
    assert toy_tokenizer.decode(sample["input_ids"][~sample["loss_mask"]]) == (
        "<|user|>Give three tips for staying healthy.<|end|><|assistant|>"
    )
    assert len(bundle.eval) == 0 and bundle.stats["eval"].samples == 0


def test_truncation_and_drop_counts(toy_tokenizer, tmp_path: Path) -> None:
    records = [
        {"question": "short?", "answer": "yes."},
        {"question": "why?", "answer": "a long answer, with many words in it " * 3},
        {"question": "a very long question that fills the whole budget " * 6, "answer": "never seen."},
        {"question": "medium question?", "answer": "medium answer, a bit longer " * 3},
    ]
    src = write_jsonl(tmp_path / "t.jsonl", records)
    rendered = [render_conversation(toy_tokenizer, c) for c in read_conversations(src)]
    lengths = [len(r.input_ids) for r in rendered]
    max_len = 40
    # The hand-made case: record 0 fits, records 1 and 3 are cut inside the answer, record 2 is cut
    # inside the question (nothing left to train: dropped).
    assert lengths[0] <= max_len < min(lengths[1:])
    assert sum(rendered[2].loss_mask[:max_len]) == 0
    assert all(sum(rendered[i].loss_mask[1:max_len]) > 0 for i in (1, 3))

    bundle = build_datasets(
        DataConfig(train=[src], eval_fraction=0.0, max_len=max_len), toy_tokenizer, 0, False
    )
    kept = [0, 1, 3]
    stats = bundle.stats["train"]
    assert stats == DataStats(
        samples=3,
        tokens=sum(min(lengths[i], max_len) for i in kept),
        trained_tokens=sum(sum(rendered[i].loss_mask[:max_len]) for i in kept),
        truncated=3,
        dropped=1,
        max_length=max_len,
    )
    assert stats.trained_share == pytest.approx(stats.trained_tokens / stats.tokens)
    # Source order is kept (no shuffling here), and each sample is the rendered record, cut.
    assert bundle.train.sources == [f"{src}:{i}" for i in kept]
    for item, i in zip(bundle.train, kept, strict=True):
        assert item["input_ids"].tolist() == rendered[i].input_ids[:max_len]
        assert item["loss_mask"].tolist() == [bool(m) for m in rendered[i].loss_mask[:max_len]]
    table = stats.format_table("train")
    assert table.splitlines()[0] == "train" and "truncated" in table and "dropped" in table


def test_collate_pads_right() -> None:
    samples = [
        {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([False, True, True])},
        {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([True])},
    ]
    batch = collate(samples, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[False, True, True], [True, False, False]]
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["loss_mask"].dtype == torch.bool
    assert collate(samples, pad_id=99)["input_ids"].tolist() == [[5, 6, 7], [8, 99, 99]]
    with pytest.raises(ValueError, match="empty batch"):
        collate([], pad_id=0)


def test_heldout_split_is_deterministic() -> None:
    items = list(range(400))
    kept, held = split_heldout(items, 0.1, seed=3)
    assert split_heldout(items, 0.1, seed=3) == (kept, held)
    assert sorted(kept + held) == items and not set(kept) & set(held)
    assert kept == sorted(kept) and held == sorted(held)  # original order inside each part
    assert 20 <= len(held) <= 60
    _, other = split_heldout(items, 0.1, seed=4)
    assert other != held
    assert split_heldout(items, 0.0, seed=3) == (items, [])
    assert len(split_heldout([1, 2, 3], 0.01, seed=0)[1]) == 1  # a non-zero fraction always holds one out


def test_build_datasets_holdout_and_limits(toy_tokenizer, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", pairs(60))
    src2 = write_jsonl(tmp_path / "b.jsonl", pairs(10, prefix="b"))
    cfg = DataConfig(train=[src, src2], eval_fraction=0.2)
    bundle = build_datasets(cfg, toy_tokenizer, seed=1, progress=False)
    again = build_datasets(cfg, toy_tokenizer, seed=1, progress=False)
    other = build_datasets(cfg, toy_tokenizer, seed=2, progress=False)
    assert bundle.eval.sources == again.eval.sources and bundle.train.sources == again.train.sources
    assert bundle.eval.sources != other.eval.sources
    all_sources = [f"{src}:{i}" for i in range(60)] + [f"{src2}:{i}" for i in range(10)]
    _, held = split_heldout(all_sources, 0.2, seed=1)
    assert bundle.eval.sources == held
    assert bundle.train.sources == [s for s in all_sources if s not in held]  # in source order

    capped = build_datasets(
        DataConfig(train=[src, src2], eval_fraction=0.2, eval_max_samples=3), toy_tokenizer, 1, False
    )
    assert capped.eval.sources == held[:3]
    assert capped.train.sources == bundle.train.sources  # the rest of the held-out records stay unused

    limited = build_datasets(
        DataConfig(train=[src, src2], eval=[src2], max_samples=65), toy_tokenizer, 0, False
    )
    assert limited.train.sources == all_sources[:65]  # max_samples spans sources
    assert limited.eval.sources == [f"{src2}:{i}" for i in range(10)]


def test_all_dropped_is_an_error(toy_tokenizer, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "long.jsonl", [{"question": "x " * 50, "answer": "y"}])
    with pytest.raises(ValueError, match="no training samples are left"):
        build_datasets(DataConfig(train=[src], eval_fraction=0.0, max_len=8), toy_tokenizer, 0, False)


def test_prompt_only_data_is_a_clear_error(toy_tokenizer, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "prompts.jsonl", [{"turns": ["only a question"]}])
    with pytest.raises(ValueError, match=r"prompts\.jsonl:0: conversation has no assistant turn"):
        build_datasets(DataConfig(train=[src], eval_fraction=0.0), toy_tokenizer, 0, False)


def test_real_data_builds(toy_tokenizer, shared_data: Path) -> None:
    gsm8k, c4 = shared_data / "gsm8k/test.jsonl", shared_data / "llamafactory_demo/c4_demo.jsonl"
    cfg = DataConfig(train=[str(gsm8k), str(c4)], max_samples=1319 + 20, eval_max_samples=50, max_len=256)
    bundle = build_datasets(cfg, toy_tokenizer, seed=0, progress=False)
    sources = [f"{gsm8k}:{i}" for i in range(1319)] + [f"{c4}:{i}" for i in range(20)]
    kept, held = split_heldout(sources, 0.05, seed=0)
    train = bundle.stats["train"]
    assert train.samples + train.dropped == len(kept)
    assert bundle.train.sources == [s for s in kept if s in set(bundle.train.sources)]  # order kept
    evals = bundle.stats["eval"]
    assert evals.samples + evals.dropped == 50
    assert bundle.eval.sources == [s for s in held[:50] if s in set(bundle.eval.sources)]
    # The toy tokenizer's 400 tokens are close to bytes: long GSM8K questions and every C4 document
    # exceed 256 tokens; questions longer than that leave nothing to train.
    assert train.max_length == 256 and train.truncated > train.dropped > 0
    assert sum(s.startswith(str(c4)) for s in bundle.train.sources) >= 15


def test_inspect_data(toy_tokenizer, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", pairs(12))
    cfg = DataConfig(train=[src], eval_fraction=0.25)
    report = inspect_data(cfg, toy_tokenizer, seed=0, num_samples=2)
    bundle = build_datasets(cfg, toy_tokenizer, seed=0, progress=False)
    first = bundle.train.sources[0]
    k = int(first.rsplit(":", 1)[1])
    question, answer = pairs(12)[k]["question"], pairs(12)[k]["answer"]
    assert f"=== {first} (" in report
    assert f"<|user|>{question}<|end|><|assistant|>«{answer}<|end|>»" in report
    assert report.count("=== ") == 2
    assert bundle.stats["train"].format_table("train") in report
    assert bundle.stats["eval"].format_table("eval") in report
    colored = inspect_data(cfg, toy_tokenizer, seed=0, num_samples=1, color=True)
    assert f"\x1b[42m\x1b[30m{answer}<|end|>\x1b[0m" in colored and "«" not in colored
    ids = toy_tokenizer("abc def", add_special_tokens=False)["input_ids"]
    assert highlight_trained(toy_tokenizer, ids, [0] * len(ids)) == "abc def"
