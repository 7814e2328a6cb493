"""Loading a target: the `target:` settings, the model and tokenizer from the Hub, a directory or a .gguf file,
and the checks that refuse what cannot be a target (models/target.py wraps the loaded model)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from .gguf import is_gguf, pretrained_source
from .identity import refuse_drafter_as_target


@dataclass
class TargetConfig:
    """Which target to load and how."""

    path: str = field(
        default="",
        metadata={
            "help": "Hugging Face Hub id (org/name), a local directory of the target model, or a .gguf file."
        },
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit)."})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "Weights dtype: auto = bfloat16 on GPU, float32 on CPU."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom modeling code shipped with the target."}
    )


def load_error(cfg: TargetConfig, err: Exception) -> Exception:
    """One line for transformers refusing to load `cfg.path` (its own messages span several lines)."""
    said = " ".join(str(err).split()).split(" This could be because")[0]  # its unknown-architecture advice
    if "trust_remote_code" in said and not cfg.trust_remote_code:
        said = "it ships its own modeling code (config.json `auto_map`), which runs only with target."
        said += "trust_remote_code=true (a recipe key; --trust-remote-code for eval, engine-eval, data regenerate): set it if you trust that code"
    elif "does not recognize this architecture" in said:
        said += " Upgrade transformers, or set target.trust_remote_code=true if it ships modeling code"
    elif isinstance(err, OSError):
        return FileNotFoundError(
            f"could not load target {cfg.path!r}: {said.rstrip('.')}. Pass a local model directory or a Hub id that "
            "this machine can reach (build a toy target with `draftsmith build-target`)."
        )
    return ValueError(f"could not load target {cfg.path!r}: {said}")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype; `auto` is bfloat16 on accelerators and float32 on CPU."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_pretrained(cfg: TargetConfig, device: torch.device, layers: int | None = None) -> tuple[Any, Any]:
    """`(model, tokenizer)` of `cfg` on `device`: from the Hub, a local directory or a .gguf file (no network
    needed for a local one); with `layers=k`, only the first k decoder layers built and read (`FrozenTarget.load`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # on use: importing it is slow

    if not cfg.path:
        raise ValueError(
            "target.path is empty: set it to a Hub id or a local model directory (target.path=DIR)"
        )
    local = Path(cfg.path).expanduser()
    if cfg.path.startswith(("/", "./", "../", "~")) and not local.is_dir() and not is_gguf(cfg.path):
        raise FileNotFoundError(
            f"target.path={cfg.path!r} is not a directory: point it at a saved model directory "
            "(with config.json and the weights), a .gguf file or a Hub id like org/name"
        )
    refuse_drafter_as_target(local)
    source, gguf = pretrained_source(cfg.path)  # a .gguf file: its folder, gguf_file=<name>
    kwargs: dict[str, Any] = {"revision": cfg.revision, "trust_remote_code": cfg.trust_remote_code}
    kwargs |= gguf
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        config = AutoConfig.from_pretrained(source, **kwargs)
        text_config = config.get_text_config()
        num_layers = int(text_config.num_hidden_layers)
        partial = layers is not None and layers < num_layers
        if partial:
            set_layer_count(text_config, max(0, int(layers)))  # type: ignore[arg-type]
        with quiet_unused_weights(enabled=partial):
            model = AutoModelForCausalLM.from_pretrained(
                source, config=config, dtype=resolve_dtype(cfg.dtype, device), **kwargs
            )
        set_layer_count(model.config.get_text_config(), num_layers)
    except (OSError, ValueError) as err:
        raise load_error(cfg, err) from err
    return model.to(device), tokenizer  # type: ignore[arg-type]


def check_vocabulary(tokenizer: Any, vocab_size: int, name: str) -> None:
    """Refuse a tokenizer with ids the model has no embedding row for (a tokenizer from another model, or
    added tokens without `resize_token_embeddings`): they would fail deep inside a forward, or train on
    garbage. A model with more rows than the tokenizer has ids (padding to a multiple of 64 / 128) is fine."""
    try:
        size = len(tokenizer)
    except TypeError:  # a stand-in without a vocabulary (tests, benchmarks)
        return
    if size > vocab_size:
        raise ValueError(
            f"target {name!r}: its tokenizer has {size} tokens but the model's embedding only {vocab_size} rows; "
            "use the tokenizer saved with the model (or resize the model's embeddings after adding tokens)"
        )


def set_layer_count(text_config: Any, n: int) -> None:
    """Set a config's decoder layer count, with its per-layer lists (e.g. `layer_types`) cut or restored."""
    types = getattr(text_config, "layer_types", None)
    if isinstance(types, list):
        full = getattr(text_config, "_draftsmith_layer_types", types)
        text_config._draftsmith_layer_types = full
        text_config.layer_types = full[:n]
    text_config.num_hidden_layers = n


@contextlib.contextmanager
def quiet_unused_weights(enabled: bool) -> Iterator[None]:
    """Silence transformers' load report while loading a target without its layers (their weights are
    unused on purpose)."""
    if not enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
