"""A run from a feature cache trains on the cache's samples, so it records the cache's data settings, not the
recipe's (train/core/entry.py `data_of_cache`); a command-line setting the cache cannot honour is refused, and a
data file the cache was built from that changed since is noticed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.train.cache.store import CacheError, FeatureCache
from draftsmith.train.core.data import DataConfig
from draftsmith.train.core.data_content import data_hashes
from draftsmith.train.core.entry import data_of_cache


def _cache(tmp_path: Path, data: dict, content: dict | None = None) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir()
    index = {"format": "draftsmith-feature-cache", "data": data, "data_sha256": content, "splits": {}}
    (cache / "index.json").write_text(json.dumps(index))
    return cache


def test_the_run_records_the_data_the_cache_was_built_from(tmp_path):
    mix = tmp_path / "mix.jsonl"
    mix.write_text('{"text": "x"}\n')
    built = {"train": [str(mix)], "eval": [], "format": "auto", "eval_fraction": 0.1, "max_len": 192}
    built |= {"max_samples": 64, "eval_max_samples": 8}
    cache = _cache(tmp_path, built)
    recipe = DataConfig(cache=str(cache), max_samples=16)  # the recipe's defaults: stdlib:train, 1024 tokens
    run = data_of_cache(recipe, explicit=["data.cache", "data.max_samples"])
    assert (run.train, run.max_len, run.eval_fraction, run.eval_max_samples) == ([str(mix)], 192, 0.1, 8)
    assert (run.max_samples, run.cache) == (
        16,
        str(cache),
    )  # a prefix of the cache, and where it is: the run's
    # an override equal to the cache's own is no conflict; one the cache cannot honour is refused
    assert data_of_cache(DataConfig(cache=str(cache), max_len=192), ["data.max_len"]).max_len == 192
    with pytest.raises(ValueError, match=r"data.max_len=96: the cache .* was built with data.max_len=192"):
        data_of_cache(DataConfig(cache=str(cache), max_len=96), ["data.max_len"])
    with pytest.raises(ValueError, match=r"data.train=\['other.jsonl'\]"):
        data_of_cache(DataConfig(cache=str(cache), train=["other.jsonl"]), ["data.train"])


def test_a_changed_data_file_of_the_adopted_settings_is_refused(tmp_path):
    mix = tmp_path / "mix.jsonl"
    mix.write_text('{"text": "x"}\n')
    built = {"train": [str(mix)], "eval": []}
    cache = _cache(tmp_path, built, {str(mix): data_hashes(DataConfig(train=[str(mix)]))[str(mix)]})
    run = data_of_cache(DataConfig(cache=str(cache)), explicit=[])
    mix.write_text('{"text": "edited in place"}\n')
    with pytest.raises(CacheError, match="mix.jsonl changed"):
        FeatureCache(cache, json.loads((cache / "index.json").read_text())).require_data(data_hashes(run))


def test_a_cache_without_a_recorded_header_leaves_the_settings(tmp_path):
    recipe = DataConfig(cache=str(tmp_path / "nowhere"), max_len=96)
    assert data_of_cache(recipe, ["data.max_len"]) == recipe
