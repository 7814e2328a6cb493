"""Resumable training state without pickle: tensors in safetensors, everything else in JSON, and a manifest
with the sha256 of every file.

accelerate's `save_state` writes the optimizer, scheduler and RNG states with `torch.save` and reads some of
them back with `weights_only=False`: resuming from a checkpoint directory someone else made would run their
code. Here (single process and DDP, where every rank holds the whole drafter) a checkpoint is:

    model.safetensors       the drafter's trainable parameters and persistent buffers
    optimizer.safetensors   every tensor of the optimizer's state (`state.<param index>.<name>`)
    optimizer.json          the rest of it (param groups, non-tensor state entries)
    scheduler.json          the LR scheduler's state_dict (draftsmith's schedules are functions: not saved)
    rng-<rank>.safetensors  torch (and CUDA) generator states of each process
    rng-<rank>.json         Python's and NumPy's generator states of each process
    manifest.json           format, and sha256 + size of every file above (checked before anything is read)

FSDP and DeepSpeed shard the optimizer in their own formats, which are pickles: those checkpoints are written
by accelerate, marked so in the manifest, and resumed only with `--trust-pickle`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import sha256_file, write_text

FORMAT = "draftsmith-state-1"
PICKLED = "accelerate-pickle"
MANIFEST = "manifest.json"
SAFE_SUFFIXES = (".json", ".safetensors", ".yaml")


class DamagedCheckpoint(UserError):
    """A checkpoint file is missing or does not match its recorded sha256."""


def write_manifest(directory: Path, fmt: str) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        str(p.relative_to(directory)): {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files
    }
    # indent=1 (write_json indents by 2): the bytes a checkpoint's manifest has always had
    write_text(directory / MANIFEST, json.dumps({"format": fmt, "files": entries}, indent=1) + "\n")


def verify_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of `directory` after checking every file it lists.

    Raises:
        DamagedCheckpoint: no manifest, or a listed file missing, truncated or changed.
    """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DamagedCheckpoint(
            f"{directory} has no {MANIFEST}: not a complete draftsmith checkpoint"
        ) from None
    except ValueError as err:
        raise DamagedCheckpoint(f"{path} is not valid JSON ({err})") from None
    for name, entry in manifest.get("files", {}).items():
        file = directory / name
        if not file.is_file():
            raise DamagedCheckpoint(f"{file} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise DamagedCheckpoint(
                f"{file} is {file.stat().st_size} bytes, {entry['bytes']} were written (truncated?)"
            )
        if sha256_file(file) != entry["sha256"]:
            raise DamagedCheckpoint(
                f"{file} does not match its sha256 in {MANIFEST} (the file was changed or damaged)"
            )
    return manifest


def pickled_files(directory: Path) -> list[str]:
    """Files of a checkpoint that are neither JSON, YAML nor safetensors (pickles, or anything unknown)."""
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and not p.name.endswith(SAFE_SUFFIXES)
    )


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters and persistent buffers (a frozen target inside the model, as Medusa-2's, is
    rebuilt from the target, never saved)."""
    keep = {n for n, p in model.named_parameters() if p.requires_grad}
    params = {n for n, _ in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=False).items():
        if name in keep or name not in params:
            t = tensor.detach().contiguous()
            if t.data_ptr() in seen:  # safetensors refuses shared storage
                t = t.clone()
            seen.add(t.data_ptr())
            out[name] = t.cpu()
    return out


def _split(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able copy of `obj` with every tensor moved into `tensors` under a dotted key."""
    if isinstance(obj, torch.Tensor):
        key = prefix
        tensors[key] = obj.detach().contiguous().cpu()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[_key(k), _split(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        items = [_split(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix} without pickle")


def _key(k: Any) -> Any:
    if isinstance(k, (bool, int, float, str)) or k is None:
        return k
    raise TypeError(f"cannot store a {type(k).__name__} key without pickle")


def _join(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `_split`."""
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: _join(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(_join(v, tensors) for v in obj["__tuple__"])
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def _save_split(obj: Any, directory: Path, name: str) -> None:
    tensors: dict[str, torch.Tensor] = {}
    meta = _split(obj, name, tensors)
    if tensors:
        save_file(tensors, str(directory / f"{name}.safetensors"))
    write_text(
        directory / f"{name}.json", json.dumps(meta) + "\n"
    )  # one line (write_json indents), as always


def _load_split(directory: Path, name: str) -> Any:
    tensor_file = directory / f"{name}.safetensors"
    tensors = load_file(str(tensor_file)) if tensor_file.is_file() else {}
    return _join(json.loads((directory / f"{name}.json").read_text()), tensors)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np_state: Any = np.random.get_state()  # ("MT19937", keys [624] uint32, pos, has_gauss, cached_gaussian)
    state["numpy"] = [np_state[0], torch.from_numpy(np.asarray(np_state[1]).astype(np.int64)), *np_state[2:]]
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


def _tuples(obj: Any) -> Any:
    """random.setstate wants tuples where JSON kept lists."""
    return tuple(_tuples(v) for v in obj) if isinstance(obj, (list, tuple)) else obj


def save_training_state(
    directory: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, rank: int, is_main: bool
) -> None:
    """Write this process's part of the state into `directory` (every rank calls it; the main one writes the
    model, optimizer and scheduler, each rank its generators)."""
    directory.mkdir(parents=True, exist_ok=True)
    if is_main:
        save_file(_trainable_state(model), str(directory / "model.safetensors"))
        _save_split(optimizer.state_dict(), directory, "optimizer")
        write_text(
            directory / "scheduler.json", json.dumps(_split(scheduler.state_dict(), "scheduler", {})) + "\n"
        )
    _save_split(rng_state(), directory, f"rng-{rank}")


def load_training_state(
    directory: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, rank: int
) -> str | None:
    """Restore what `save_training_state` wrote; returns a notice when this rank's generators were not saved
    (more processes than the run that saved it)."""
    state = load_file(str(directory / "model.safetensors"))
    expected = _trainable_state(model)
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise UserError(
            f"{directory} holds another drafter's weights (missing {missing[:3]}, unexpected {extra[:3]}); resume a "
            "checkpoint of this recipe"
        )
    model.load_state_dict(state, strict=False)
    # On the CPU as saved: the optimizer moves each state tensor to its parameter's device itself, except
    # AdamW's `step`, which must stay a CPU tensor unless the optimizer is capturable / fused.
    optimizer.load_state_dict(_load_split(directory, "optimizer"))
    scheduler.load_state_dict(_join(json.loads((directory / "scheduler.json").read_text()), {}))
    if not (directory / f"rng-{rank}.json").is_file():
        return f"note: {directory} has no generator state for process {rank}; it continues from the seed"
    set_rng_state(_load_split(directory, f"rng-{rank}"))
    return None
