"""The offline hidden-state cache: storage codec, shard planning, what is stored, integrity checks,
resume, process sharding, and training from it without the target's layers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from draftsmith.config.loader import load_config
from draftsmith.models.target import FrozenTarget, TargetConfig, feature_key
from draftsmith.train.cache.build import build_cache, finish_index
from draftsmith.train.cache.format import CacheError, decode, encode
from draftsmith.train.cache.store import FeatureCache, plan_shards
from draftsmith.train.core.data import build_datasets, collate, sample_lengths
from draftsmith.train.eagle import RECIPE as EAGLE_RECIPE
from draftsmith.train.eagle import build_method as build_eagle
from draftsmith.train.medusa import RECIPE as MEDUSA_RECIPE
from draftsmith.train.medusa import cache_layers as medusa_layers

REPO = Path(__file__).resolve().parents[3]
SMALL = ["data.max_samples=24", "data.eval_max_samples=6", "data.max_len=192"]


def eagle_cfg(target: Path, cache: Path, *more: str):
    return load_config(
        EAGLE_RECIPE,
        REPO / "recipes" / "eagle" / "eagle3_tiny.yaml",
        [f"target.path={target}", f"data.cache={cache}", *SMALL, *more],
    )


def build(cfg, storage="bf16", shard_tokens=400, rank=0, world=1) -> Path:
    planned = build_cache("eagle", cfg, storage, shard_tokens, 4, rank=rank, world=world, progress=False)
    out = Path(cfg.data.cache)
    finish_index(out, out / "settings.json", planned)
    return out


@pytest.fixture(scope="module")
def bf16_cache(tiny_toy_target, tmp_path_factory) -> Path:
    return build(eagle_cfg(tiny_toy_target, tmp_path_factory.mktemp("c") / "bf16"))


def test_codec_round_trip_error_bounds():
    torch.manual_seed(0)
    x = torch.randn(300, 16) * torch.logspace(-3, 2, 16)  # channels of very different scales
    bf16 = decode(*_parts(encode(x, "bf16")))
    assert ((bf16 - x).abs() <= x.abs() * 2**-8 + 1e-30).all()  # bf16: 8 significant bits
    q = encode(x, "fp8")
    assert q[""].dtype == torch.float8_e4m3fn and q[".scale"].shape == (16,)
    fp8 = decode(*_parts(q))
    amax = x.abs().amax(0)
    # e4m3: 4 significant bits for normal values (relative 2**-4), absolute 2**-10 * scale below 2**-6 * scale
    bound = torch.maximum(x.abs() * 2**-4, (amax / 448) * 2**-10)
    assert ((fp8 - x).abs() <= bound * 1.0001).all()
    # each channel's largest magnitude maps to 448, which e4m3 holds exactly
    torch.testing.assert_close(fp8.abs().amax(0), amax, rtol=1e-6, atol=0)


def _parts(stored: dict[str, torch.Tensor]):
    return stored[""], stored.get(".scale")


def test_plan_shards_by_tokens():
    assert plan_shards([5, 5, 5, 5, 5], 10) == [(0, 2), (2, 4), (4, 5)]
    assert plan_shards([30, 1, 1], 10) == [(0, 1), (1, 3)]
    assert plan_shards([], 10) == []


def test_cache_holds_the_targets_features_for_the_recipe(tiny_toy_target, bf16_cache):
    cache = FeatureCache.open(bf16_cache)
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target), dtype="float32"))
    assert cache.layers == [2, target.num_layers // 2, target.num_layers - 3, "final"]  # EAGLE-3 taps + final
    assert not any("logits" in k for k in json.dumps(cache.index))  # never vocabulary-sized logits
    cfg = eagle_cfg(tiny_toy_target, bf16_cache)
    data = build_datasets(cfg.data, target.tokenizer, seed=cfg.seed, progress=False)
    for split, online in (("train", data.train), ("eval", data.eval)):
        cached = cache.dataset(split)
        assert len(cached) == len(online) > 0
        assert sample_lengths(cached) == [len(online[i]["input_ids"]) for i in range(len(online))] != []
        for i in (0, len(online) - 1):
            item = cached[i]
            assert torch.equal(item["input_ids"], online[i]["input_ids"])
            assert torch.equal(item["loss_mask"], online[i]["loss_mask"])
            feats, _ = target.forward(item["input_ids"][None], layer_ids=cache.layers)
            for lid in cache.layers:
                ref = feats[lid][0]
                assert ((item[f"feat.{lid}"] - ref).abs() <= ref.abs() * 2**-8 + 1e-6).all(), (split, i, lid)


def test_top1_labels_cache_the_targets_greedy_tokens_as_int32(tiny_toy_target, tmp_path):
    """`draft.labels=top1`: the cache holds the taps and the target's argmax at every position (int32, in fp8
    storage too), equal to the argmax of the target's own logits; no `final` state."""
    cfg = eagle_cfg(tiny_toy_target, tmp_path / "top1", "draft.labels=top1")
    cache = FeatureCache.open(build(cfg, storage="fp8"))
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target), dtype="float32"))
    assert cache.layers == [2, target.num_layers // 2, target.num_layers - 3, "top1"]
    tokens = cache.index["splits"]["train"]["tokens"]
    item = cache.dataset("train")[1]
    logits = target.model(item["input_ids"][None]).logits[0]
    assert item["feat.top1"].dtype == torch.long
    assert torch.equal(item["feat.top1"], logits.argmax(-1))
    with safe_open(str(cache.directory / cache.index["splits"]["train"]["shards"][0]["file"]), "pt") as f:
        assert f.get_slice("feat.top1").get_dtype() == "I32"
    # The draft vocabulary is chosen from the labels: the target's greedy tokens at the trained positions
    from draftsmith.train.eagle_vocab import label_token_counts

    train = cache.dataset("train")
    expected = torch.zeros(target.vocab_size, dtype=torch.long)
    for i in range(len(train)):
        logits = target.model(train[i]["input_ids"][None]).logits[0]
        expected += torch.bincount(
            logits.argmax(-1)[:-1][train[i]["loss_mask"][1:]], minlength=target.vocab_size
        )
    assert torch.equal(label_token_counts(train, target.vocab_size, "top1"), expected)
    data_counts = label_token_counts(train, target.vocab_size, "data")
    assert not torch.equal(data_counts, expected)  # the data's tokens are not the target's
    # per token, one byte per tap channel and four for the label; per shard, a float32 scale per tap channel
    scales = 4 * 3 * target.hidden_size * len(cache.index["splits"]["train"]["shards"])
    assert cache.index["splits"]["train"]["feature_bytes"] == tokens * (3 * target.hidden_size + 4) + scales


def test_max_samples_trains_on_the_caches_first_samples(bf16_cache):
    """`data.max_samples=N` with a cache: its first N train samples (across shards), with their own stats; the
    eval split is the cache's whole eval split."""
    from draftsmith.train.core.data import load_cached_datasets

    cache = FeatureCache.open(bf16_cache)
    full = load_cached_datasets(cache, torch.float32)
    n = cache.index["splits"]["train"]["shards"][0]["samples"][1] + 2  # one shard and part of the next
    part = load_cached_datasets(cache, torch.float32, max_samples=n)
    assert len(part.train) == n < len(full.train) and len(part.eval) == len(full.eval)
    for i in (0, n - 1):
        assert torch.equal(part.train[i]["feat.2"], full.train[i]["feat.2"])
    with pytest.raises(IndexError):
        part.train[n]
    items = [full.train[i] for i in range(n)]
    stats = part.stats["train"]
    assert stats.samples == n
    assert stats.tokens == sum(len(x["input_ids"]) for x in items)
    assert stats.trained_tokens == sum(int(x["loss_mask"].sum()) for x in items)
    assert stats.max_length == max(len(x["input_ids"]) for x in items)
    assert sample_lengths(part.train) == [len(x["input_ids"]) for x in items]
    assert load_cached_datasets(cache, torch.float32, max_samples=10**6).stats == full.stats


def test_fp8_cache_halves_the_bytes(tiny_toy_target, bf16_cache, tmp_path):
    fp8 = build(eagle_cfg(tiny_toy_target, tmp_path / "fp8"), storage="fp8")
    a, b = FeatureCache.open(bf16_cache).index, FeatureCache.open(fp8).index
    for split in ("train", "eval"):
        # fp8: one byte per value instead of two, plus one float32 scale per channel, layer and shard
        scales = 4 * b["hidden_size"] * len(b["layers"]) * len(b["splits"][split]["shards"])
        assert b["splits"][split]["feature_bytes"] == a["splits"][split]["feature_bytes"] // 2 + scales
    x, y = FeatureCache.open(bf16_cache).dataset("train")[3], FeatureCache.open(fp8).dataset("train")[3]
    for key in ("feat.2", "feat.final"):
        amax = x[key].abs().amax(0)
        assert (
            (y[key] - x[key]).abs() <= torch.maximum(x[key].abs() * 2**-4, amax * 2**-10) * 1.02 + 1e-6
        ).all()


def test_truncated_and_corrupt_shards_are_named(tiny_toy_target, tmp_path):
    out = build(eagle_cfg(tiny_toy_target, tmp_path / "c"))
    shard = out / "train-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte in the features
    shard.write_bytes(bytes(data))
    lazy = FeatureCache.open(
        out, verify=False
    )  # sizes agree: only the checksum can tell, checked on first read
    train = lazy.dataset("train")
    first_other = next(i for i in range(len(train)) if train.shards[1]["samples"][0] <= i)
    train[0]  # shard 0 is intact: read
    with pytest.raises(CacheError, match=r"train-00001\.safetensors is corrupt"):
        train[first_other]  # no sample of the corrupt shard is ever returned
    with pytest.raises(CacheError, match=r"train-00001\.safetensors is corrupt"):
        lazy.dataset("train").tokens_only()[first_other]
    with pytest.raises(CacheError, match=r"train-00001\.safetensors is corrupt"):
        FeatureCache.open(out)
    shard.write_bytes(bytes(data[:-100]))
    with pytest.raises(CacheError, match=r"train-00001\.safetensors is truncated"):
        FeatureCache.open(out, verify=False)
    with pytest.raises(CacheError, match="holds no index.json"):
        FeatureCache.open(tmp_path / "nothing")


def test_an_interrupted_build_resumes_and_rewrites_only_what_is_missing_or_damaged(tiny_toy_target, tmp_path):
    cfg = eagle_cfg(tiny_toy_target, tmp_path / "c")
    out = build(cfg)
    index = json.loads((out / "index.json").read_text())
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) >= 4
    (out / "index.json").unlink()  # as if killed before the end
    (out / "train-00000.json").unlink()  # its shard counts as unfinished
    with (out / "eval-00000.safetensors").open("r+b") as f:  # damaged after it was recorded
        f.truncate(100)
    for p in shards:
        os.utime(p, (1, 1))
    build(cfg)
    rewritten = {p.name for p in shards if p.stat().st_mtime > 1}
    assert rewritten == {"train-00000.safetensors", "eval-00000.safetensors"}
    assert json.loads((out / "index.json").read_text()) == index  # the same bytes, the same checksums
    with pytest.raises(ValueError, match="other settings"):
        build(eagle_cfg(tiny_toy_target, out, "data.max_len=64"))


def test_two_processes_split_the_shards_and_write_the_same_cache(tiny_toy_target, bf16_cache, tmp_path):
    out = tmp_path / "two"
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "draftsmith.train.cache.build",
        "eagle",
        "--config",
        str(REPO / "recipes" / "eagle" / "eagle3_tiny.yaml"),
        f"target.path={tiny_toy_target}",
        f"data.cache={out}",
        *SMALL,
        "--shard-tokens",
        "400",
        "--batch-size",
        "4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (
        json.loads((bf16_cache / "index.json").read_text()),
        json.loads((out / "index.json").read_text()),
    )
    assert [s["sha256"] for s in two["splits"]["train"]["shards"]] == [
        s["sha256"] for s in one["splits"]["train"]["shards"]
    ]
    assert "train from it with" in proc.stdout


def test_training_batches_from_the_cache_give_the_online_loss(tiny_toy_target, bf16_cache):
    """EAGLE-3's loss terms on a cached batch (features from disk, logits through the frozen head of a
    target loaded without its layers) equal those of the same batch computed online."""
    cfg = eagle_cfg(tiny_toy_target, bf16_cache)
    live = FrozenTarget.load(cfg.target)
    head_only = FrozenTarget.load(cfg.target, layers=0)
    assert not head_only.has_layers and len(head_only.decoder.layers) == 0
    assert head_only.identity() == live.identity()
    assert sum(p.numel() for p in head_only.model.parameters()) < 0.5 * sum(
        p.numel() for p in live.model.parameters()
    )
    cache = FeatureCache.open(bf16_cache)
    samples = [cache.dataset("train")[i] for i in range(4)]
    cached = collate(samples, 0)
    online = {k: v for k, v in cached.items() if not k.startswith("feat.")}
    data = build_datasets(cfg.data, live.tokenizer, seed=0, progress=False)
    torch.manual_seed(0)
    method_live = build_eagle(cfg, live, data)
    torch.manual_seed(0)
    method_cached = build_eagle(cfg, head_only, data)
    method_cached.model.load_state_dict(method_live.model.state_dict())
    a, _ = method_live.loss_terms(method_live.model, online)
    b, _ = method_cached.loss_terms(method_cached.model, cached)
    # The oracle: the same batch with the live target's features rounded to bf16 as the cache stores them.
    # The cache path adds nothing to that rounding; bf16 keeps 8 significant bits, so against the unrounded
    # online loss only a bf16-sized relative difference (2^-8 = 0.0039 per value) is expected.
    layers = [lid for lid in cache.layers if lid != "final"]
    live_feats, _ = live.forward(online["input_ids"], online["attention_mask"], [*layers, "final"])
    rounded = {**online, **{feature_key(lid): f.to(torch.bfloat16) for lid, f in live_feats.items()}}
    c, _ = method_cached.loss_terms(method_cached.model, rounded)
    torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b, a, rtol=2**-6, atol=1e-3)
    with pytest.raises(RuntimeError, match="without its decoder layers"):
        method_cached.loss_terms(method_cached.model, online)


def test_eagle3_with_data_labels_caches_no_final_state():
    from draftsmith.train.eagle import cache_layers as eagle_layers

    taps = ["target.path=t", "draft.feature_layers=[1,2,3]"]
    assert eagle_layers(load_config(EAGLE_RECIPE, None, taps), None) == [1, 2, 3, "final"]  # type: ignore[arg-type]
    data = load_config(EAGLE_RECIPE, None, [*taps, "draft.labels=data"])
    assert eagle_layers(data, None) == [1, 2, 3]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft.labels=data is EAGLE-3's option"):
        load_config(EAGLE_RECIPE, None, [*taps, "draft.labels=data", "draft.version=1"])
    for bad in ("objective.loss=kl", "objective.weighting=dpace"):
        with pytest.raises(ValueError, match="needs the target's distribution"):
            load_config(EAGLE_RECIPE, None, [*taps, "draft.labels=data", bad])
    load_config(EAGLE_RECIPE, None, [*taps, "draft.labels=data", "objective.loss=ce"])  # the same loss


def test_drafters_that_need_the_live_target_refuse_a_cache(tiny_toy_target):
    cfg = load_config(
        MEDUSA_RECIPE, REPO / "recipes" / "medusa" / "medusa2_toy.yaml", [f"target.path={tiny_toy_target}"]
    )
    with pytest.raises(ValueError, match="Medusa-2 trains an adapter inside the target"):
        medusa_layers(cfg, None)  # type: ignore[arg-type]
    from draftsmith.train.distill import RECIPE as DISTILL_RECIPE
    from draftsmith.train.distill import cache_layers as distill_layers

    on_policy = load_config(DISTILL_RECIPE, None, ["target.path=t", "distill.on_policy=0.5"])
    with pytest.raises(ValueError, match="on_policy=0.5 scores the draft's own samples with the live target"):
        distill_layers(on_policy, None)  # type: ignore[arg-type]
    assert distill_layers(load_config(DISTILL_RECIPE, None, ["target.path=t"]), None) == ["final"]  # type: ignore[arg-type]


def test_recipe_trains_from_the_cache_on_two_processes(tiny_toy_target, bf16_cache, tmp_path):
    """`accelerate launch --config_file recipes/accelerate/ddp.yaml train/eagle.py ... data.cache=DIR`."""
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "recipes" / "accelerate" / "ddp.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        "0",
        str(REPO / "train" / "eagle.py"),
        "--config",
        str(REPO / "recipes" / "eagle" / "eagle3_tiny.yaml"),
        f"target.path={tiny_toy_target}",
        f"data.cache={bf16_cache}",
        f"output_dir={out}",
        *SMALL,
        "train.max_steps=4",
        "train.micro_batch_size=2",
        "log.every=1",
        "checkpoint.every=0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["training"]["recipe"]["data"]["cache"] == str(bf16_cache)
    assert (
        config["target"]["num_layers"]
        == FrozenTarget.load(TargetConfig(path=str(tiny_toy_target))).num_layers
    )
    assert "verify cache" in proc.stderr


def write_answers(path: Path, first: int = 0, count: int = 20) -> Path:
    """A local data file: `count` standard-library conversations from record `first` on, as `messages` lines."""
    from draftsmith.data.conversations import read_conversations

    convs = read_conversations("stdlib:train", limit=first + count)[first:]
    path.write_text("".join(json.dumps({"messages": c.messages}) + "\n" for c in convs))
    return path


def test_a_data_file_edited_in_place_is_noticed_by_the_cache(tiny_toy_target, tmp_path):
    """The cache records the sha256 of its data file; building into it again reuses every shard while the file
    holds the same bytes and is refused, naming the file, once it was edited; training checks the same."""
    from draftsmith.runtime.files import sha256_file

    answers = write_answers(tmp_path / "answers.jsonl")
    cfg = eagle_cfg(tiny_toy_target, tmp_path / "c", f"data.train=[{answers}]")
    out = build(cfg)
    recorded = {str(answers): sha256_file(answers)}
    assert json.loads((out / "settings.json").read_text())["data_sha256"] == recorded
    assert json.loads((out / "index.json").read_text())["data_sha256"] == recorded
    assert FeatureCache.open(out, data=recorded).data_sha256 == recorded

    # The same bytes, rewritten: every shard is reused, none rewritten.
    write_answers(answers)
    shards = sorted(out.glob("*.safetensors"))
    for p in shards:
        os.utime(p, (1, 1))
    index = (out / "index.json").read_text()
    build(cfg)
    assert [p.stat().st_mtime for p in shards] == [1] * len(shards)
    assert (out / "index.json").read_text() == index

    # Edited in place (other conversations, same path): refused before anything is read or written.
    old = recorded[str(answers)]
    write_answers(answers, first=20)
    new = sha256_file(answers)
    with pytest.raises(ValueError) as refused:
        build(cfg)
    assert str(refused.value) == (
        f"{out} holds a cache built from data whose content has changed since: {answers} changed (sha256 "
        f"{old[:12]} then, {new[:12]} now); choose another data.cache directory or delete this one"
    )
    assert [p.stat().st_mtime for p in shards] == [1] * len(shards)
    assert (out / "index.json").read_text() == index
    with pytest.raises(
        CacheError, match=rf"was built from other data than the recipe names: {answers} changed"
    ):
        FeatureCache.open(out, data={str(answers): new})
    other = write_answers(tmp_path / "other.jsonl", first=20)
    with pytest.raises(
        CacheError, match=r"other\.jsonl is not a file it was made from \(made from: .*answers"
    ):
        FeatureCache.open(out, data={str(other): sha256_file(other)})
    assert FeatureCache.open(out, data={}).index["data_sha256"] == recorded  # a recipe of built-in data only
