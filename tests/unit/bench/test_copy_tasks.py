"""Copy tasks: the passages, the merged cache (read back against its two sources) and the per-step probe count."""

from pathlib import Path

import pytest
import torch

from bench.copy_tasks import ASKS, make, merge, passage, pieces, step_hits
from draftsmith.train.cache.store import FeatureCache, write_index, write_shard


def test_a_passage_ends_after_its_last_full_sentence_and_pieces_cover_the_text() -> None:
    text = ("A" * 150 + ". ") * 2 + "B" * 250 + ". " + "C" * 30 + "."
    assert passage(text, max_chars=400) == ("A" * 150 + ". ") + "A" * 150 + "."
    assert passage("short", max_chars=40) == "short"
    assert passage("x" * 50, max_chars=40) == "x" * 40  # no sentence end: cut at the limit
    assert passage("Too early. " + "y" * 500, max_chars=400) == ("Too early. " + "y" * 500)[:400]
    parts = pieces(text, max_chars=400)
    assert parts == [passage(text, 400), "B" * 250 + ". " + "C" * 30 + "."]
    assert " ".join(parts) == text


def test_copy_chats_answer_with_their_passage_and_held_out_prompts_come_after_them() -> None:
    docs = [f"Document {i}. It has two sentences." for i in range(8)]
    chats, prompts = make(docs, ["An article."], train=4, per_article=1, evals=2, eval_start=6, seed=0)
    assert len(chats) == 5 and len(prompts) == 2
    for chat in chats:
        user, answer = chat["messages"][0]["content"], chat["messages"][1]["content"]
        ask, _, text = user.partition("\n\n")
        assert ask in ASKS and text == answer
    assert sorted(c["messages"][1]["content"] for c in chats) == sorted([*docs[:4], "An article."])
    assert [p["turns"][0].partition("\n\n")[2] for p in prompts] == docs[6:8]
    assert make(docs, ["An article."], 4, 1, 2, 6, seed=0) == (chats, prompts)  # deterministic
    with pytest.raises(ValueError, match="inside"):
        make(docs, [], train=4, per_article=1, evals=2, eval_start=3, seed=0)


def _cache(directory: Path, lengths: list[int], base: int, layers: list[str]) -> list[torch.Tensor]:
    directory.mkdir()
    samples = [
        {"input_ids": torch.arange(n) + base + 100 * i, "loss_mask": torch.ones(n, dtype=torch.bool)}
        for i, n in enumerate(lengths)
    ]
    feats = [torch.randn(n, 4) for n in lengths]
    half = len(samples) // 2
    entries = [
        write_shard(directory, "train-00000", samples[:half], {2: feats[:half]}, "bf16", 0),
        write_shard(directory, "train-00001", samples[half:], {2: feats[half:]}, "bf16", half),
    ]
    header = {"method": "eagle", "target": {"name": "t"}, "layers": layers, "storage": "bf16", "hidden_size": 4,
              "data": {"train": [str(directory)]}, "data_sha256": {str(directory): base}}  # fmt: skip
    write_index(directory, header, {"train": entries})
    return [s["input_ids"] for s in samples]


def test_merged_cache_reads_the_first_caches_samples_then_the_seconds(tmp_path: Path) -> None:
    first = _cache(tmp_path / "a", [3, 4, 5], base=0, layers=["2"])
    second = _cache(tmp_path / "b", [2, 6], base=1000, layers=["2"])
    counts = merge(tmp_path / "a", tmp_path / "b", tmp_path / "m")
    assert counts == {"train": (5, 20)}
    merged = FeatureCache.open(tmp_path / "m", progress=False)
    assert merged.data_sha256 == {str(tmp_path / "a"): 0, str(tmp_path / "b"): 1000}
    data, sources = merged.dataset("train"), [FeatureCache.open(tmp_path / d, progress=False) for d in "ab"]
    expected = [
        item
        for cache in sources
        for item in (cache.dataset("train")[i] for i in range(len(cache.dataset("train"))))
    ]
    assert len(data) == 5
    for i, want in enumerate(expected):
        got = data[i]
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["feat.2"], want["feat.2"])
    assert [data[i]["input_ids"].tolist() for i in range(5)] == [x.tolist() for x in first + second]
    with pytest.raises(ValueError, match="exists"):
        merge(tmp_path / "a", tmp_path / "b", tmp_path / "m")


def test_caches_of_other_layers_are_not_merged(tmp_path: Path) -> None:
    _cache(tmp_path / "a", [3, 4], base=0, layers=["2"])
    _cache(tmp_path / "b", [3, 4], base=9, layers=["2", "top1"])
    with pytest.raises(ValueError, match="layers"):
        merge(tmp_path / "a", tmp_path / "b", tmp_path / "m")


def test_step_hits_compare_column_t_with_the_greedy_token_s_plus_one_ahead() -> None:
    top1 = torch.tensor([10, 11, 12, 13, 14])
    answer = torch.tensor([False, False, True, True, True])
    step0 = torch.tensor(
        [11, 12, 0, 14, 99]
    )  # column t predicts top1[t+1]: right at t=0,1,3; answer at 2,3,4
    step1 = torch.tensor([12, 0, 14, 99, 99])  # column t predicts top1[t+2]: right at t=0,2; answer at 2,3,4
    hits, counts = step_hits([step0, step1], top1, answer)
    assert counts == [3, 3] and hits == [2, 2]
