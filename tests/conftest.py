"""Shared fixtures: tiny in-process targets for unit tests, a `tiny` toy target for end-to-end tests."""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def toy_tokenizer():
    """A small byte-level BPE with the toy chat template, trained on some standard-library source."""
    import json
    import textwrap

    from draftsmith.toy.tokenizer import train_tokenizer

    texts = [inspect.getsource(m) for m in (json, textwrap, inspect)]
    return train_tokenizer(texts, vocab_size=400)


def make_tiny_llama(vocab_size: int, layers: int = 4, hidden: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_random_target(toy_tokenizer):
    """A random 4-layer Llama paired with `toy_tokenizer` (unit tests only: acceptance means nothing here)."""
    from draftsmith.models.target import FrozenTarget

    return FrozenTarget(make_tiny_llama(len(toy_tokenizer)), toy_tokenizer, "tiny-random-llama")


@pytest.fixture(scope="session")
def saved_tiny_target(tiny_random_target, tmp_path_factory):
    """`tiny_random_target` saved as a model directory and reloaded from it (for code that reads the target
    from disk: exports, pushes)."""
    from draftsmith.models.target import FrozenTarget, TargetConfig

    path = tmp_path_factory.mktemp("saved-target")
    tiny_random_target.model.save_pretrained(path)
    tiny_random_target.tokenizer.save_pretrained(path)
    return FrozenTarget.load(TargetConfig(path=str(path), dtype="float32"))


def _toy_source_hash() -> str:
    import draftsmith.data.stdlib_corpus as corpus
    import draftsmith.toy.presets as presets
    import draftsmith.toy.target as toy
    import draftsmith.toy.tokenizer as tok

    h = hashlib.sha256(sys.version.encode())
    for mod in (corpus, presets, toy, tok):
        h.update(Path(inspect.getfile(mod)).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_toy_target(tmp_path_factory) -> Path:
    """The `tiny` toy target, built once per source version (cached under $DRAFTSMITH_CACHE)."""
    from draftsmith.runtime.files import user_cache
    from draftsmith.toy.target import build_toy_target

    out = user_cache() / "test-targets" / f"tiny-seed0-{_toy_source_hash()}"
    if not (out / "build.json").is_file():
        build_toy_target("tiny", out, seed=0, force=True, progress=False)
    return out


@pytest.fixture(scope="session")
def straight(tiny_toy_target, tmp_path_factory):
    """An uninterrupted short Medusa-1 run (tests/recipes/_run.py's `SHORT`): the oracle every interrupted and
    resumed run of the run-safety tests must equal bit for bit."""
    from _run import SHORT, run_recipe  # tests/recipes/, on the path while its tests run

    out = tmp_path_factory.mktemp("straight") / "run"
    run_recipe(tiny_toy_target, out, *SHORT)
    return out


@pytest.fixture(scope="session")
def vllm_env():
    """vLLM's venv (`draftsmith engine-setup vllm`); skipped without it, failed under DRAFTSMITH_REQUIRE_ENGINE=1
    (scripts/test.sh sets it after setting the engine up)."""
    from draftsmith.engines.setup import engine_spec, find_env

    found = find_env(engine_spec("vllm"))
    if found is None:
        if os.environ.get("DRAFTSMITH_REQUIRE_ENGINE") == "1":
            pytest.fail(
                "DRAFTSMITH_REQUIRE_ENGINE=1 but vLLM is not set up: run `draftsmith engine-setup vllm`"
            )
        pytest.skip("vLLM is not set up (`draftsmith engine-setup vllm`)")
    return found


@pytest.fixture(scope="session")
def smollm2_target(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as a transformers directory, built from the packaged GGUF (scripts/test.sh installs
    it); skipped without the package, failed under DRAFTSMITH_REQUIRE_ENGINE=1."""
    from draftsmith.models import gguf

    out = tmp_path_factory.mktemp("smollm2") / "target"
    try:
        gguf.build_packaged("smollm2-135m-instruct", out)
    except gguf.NotInstalled as err:
        if os.environ.get("DRAFTSMITH_REQUIRE_ENGINE") == "1":
            pytest.fail(f"DRAFTSMITH_REQUIRE_ENGINE=1 but {err}")
        pytest.skip(str(err))
    return out
