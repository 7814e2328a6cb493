"""engine-eval's `--plain-cache`: where a plain vLLM run is kept and found again, keyed by the job and the
target's content (not its path), so several drafters compared on the same prompts decode them plainly once."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from draftsmith.runtime.files import sha256_file

# The files of a target directory vLLM reads (the tokenizer is not: the prompts are ids), by suffix or name
TARGET_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TARGET_FILE_NAMES = ("config.json", "generation_config.json")
# What a plain run depends on among the target's identity fields (not its path)
TARGET_IDENTITY_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "tokenizer_sha256",
    "chat_template_sha256",
    "weights_sha256",
)


def target_fingerprint(target: Any, directory: Path) -> dict[str, Any]:
    """What vLLM's plain decoding of the target depends on, by content and not by path: the fingerprints its
    identity records (LM head and final norm, tokenizer, chat template) and the sha256 of every file vLLM
    reads from `directory` (config, generation config, weights). A target rebuilt at the same path is
    another target."""
    identity = target.identity()
    files = {}
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            read = path.suffix in TARGET_FILE_SUFFIXES or path.name in TARGET_FILE_NAMES
            if path.is_file() and (read or path.name.endswith(".index.json")):
                files[path.name] = sha256_file(path)
    return {"identity": {k: identity.get(k) for k in TARGET_IDENTITY_KEYS}, "files": files}


def plain_cache_file(folder: str, plain_job: dict[str, Any], engine: Any, target: dict[str, Any]) -> Path:
    """Where a plain run of exactly this job is kept: named by the sha256 of the job without the model's path,
    the target's content (`target_fingerprint`) and the engine that runs it (any JSON: its venv's python and the
    settings its speed depends on, vllm_engine.py `speed_settings`)."""
    content = {k: v for k, v in plain_job.items() if k != "model"}
    key = hashlib.sha256(json.dumps([content, target, engine], sort_keys=True).encode()).hexdigest()[:20]
    return Path(folder).expanduser() / f"vllm-plain-{key}.json"
