"""What every engine export shares: the layer-id translation table, the validator, and the atomic writer (the
target an export is checked against is `target_info.TargetInfo`).

An exporter builds an `Export` (engine config + tensors under the engine's names) from a draftsmith
checkpoint; `validate` then checks it against a `LayoutSpec` that is derived independently, from the target's
config and the drafter's hyper-parameters only (the names, shapes and config values the engine reads, as
docs/ENGINES.md describes them). Nothing is written unless every check passes,
because every failure class below made an engine load silently and accept ~1 token per step:

- `d2t` missing for a pruned draft vocabulary (NeMo-Automodel#2447): the engine maps draft id i to target id i.
- a wrong `max_position_embeddings` or rope setting in the draft config (SpecForge#271).
- an `embed_tokens` that is not the target's (TorchSpec#38, vllm#50158): the engine compares or uses it.
- a bias tensor the engine's module needs but the config does not announce, or vice versa (vllm#11126).
- layer ids in the wrong convention (the three conventions of ENGINES.md 6.3; table below).
- (Gemma's sqrt(H) embedding scale, ModelOpt's debug README, cannot happen: drafters embed with the plain
  table in training, as the engines' drafts do when served; models/target.py `PlainEmbedding`.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from draftsmith.runtime.files import atomic_dir, draftsmith_version, file_manifest, write_json

from .target_info import TargetInfo

# Layer-id conventions. draftsmith's canonical id c is transformers' hidden_states[c]: the pre-norm residual
# stream entering decoder layer c (= the output of layer c - 1). Each engine names the same tensor as
# c + offset:
#   vllm / speculators: offset 0. vLLM's aux-hidden-state capture appends the stream before layer k runs.
#   sglang / official / modelopt: offset -1. SGLang's set_eagle3_layers_to_capture adds +1 internally, so id k
#       is the OUTPUT of layer k; ModelOpt writes its ids for SGLang (Llama-3-8B default [1, 15, 28]).
#   trtllm: offset -1. eagle3_layers_to_capture is the output of layer k (default {1, L/2-1, L-4}).
# EAGLE-3's paper taps (canonical 2, L//2, L-3) are therefore [2, 16, 29] for vLLM and [1, 15, 28] for SGLang
# and TensorRT-LLM when L = 32. The same official-layout config.json read by vLLM and by SGLang selects
# different layers when it carries ids, so each export is written for one engine.
LAYER_ID_OFFSETS: dict[str, int] = {
    "draftsmith": 0,
    "vllm": 0,
    "speculators": 0,
    "sglang": -1,
    "official": -1,
    "modelopt": -1,
    "trtllm": -1,
}


def to_engine_ids(canonical: Sequence[int], engine: str, num_layers: int) -> list[int]:
    """Canonical ids -> `engine`'s ids; refuses ids the engine cannot name (e.g. the embedding for SGLang)."""
    offset = LAYER_ID_OFFSETS[engine]
    ids = [int(c) + offset for c in canonical]
    # Either way an engine names only layers that exist: ids 0..L-1 (before layer k runs, or after it ran).
    bad = [c for c, i in zip(canonical, ids, strict=True) if not 0 <= i < num_layers]
    if bad:
        raise ExportError(
            f"canonical layer ids {bad} have no {engine} equivalent in a {num_layers}-layer target "
            f"({engine} ids run 0..{num_layers - 1}, canonical {-offset}..{num_layers - 1 - offset})"
        )
    return ids


def from_engine_ids(ids: Sequence[int], engine: str) -> list[int]:
    """`engine`'s ids -> canonical ids (the inverse of `to_engine_ids`)."""
    return [int(i) - LAYER_ID_OFFSETS[engine] for i in ids]


class ExportError(ValueError):
    """An export that would load in the engine but compute something else; nothing was written."""


@dataclass
class LayoutSpec:
    """What an engine reads, derived from the target and the drafter's hyper-parameters (never from the export).

    Attributes:
        tensors: every required tensor name -> shape.
        optional: tensors the engine accepts but does not need -> shape.
        config: config.json entries the engine reads (dotted paths for nested keys) -> the required value.
        draft_vocab: `(d2t name, t2d name or None, draft vocabulary size)` when the vocabulary is mapped.
        shared: tensor name -> "embedding" | "lm_head": must be bit-identical to the target's.
        dtypes: tensor name -> required dtype (the vocabulary maps); others must be floating point.
        own_embedding: the drafter has its own embedding (a draft LM), so embed_tokens is not the target's.
    """

    tensors: dict[str, tuple[int, ...]]
    optional: dict[str, tuple[int, ...]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    draft_vocab: tuple[str, str | None, int] | None = None
    shared: dict[str, str] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    own_embedding: bool = False  # a draft LM has its own embedding; other drafters use the target's


@dataclass
class Export:
    """An engine-layout export before it is written.

    Attributes:
        layout: the layout's name (e.g. "eagle3-sglang").
        engine: the engine it was written for (vllm, sglang, tgi, hf).
        config: the engine's config.json.
        tensors: the engine's tensors (names as the engine loads them).
        weights_file: where the tensors go.
        serve: copy-paste serving commands, `{dir}` standing for the export directory.
        notes: what a user of this layout must know.
        extra: writers of more files (`name -> fn(tmp_dir)`), e.g. a tokenizer or a merged target.
        layer_ids: `{"canonical": [...], engine: [...]}` when the drafter reads target layers.
        speculative: vLLM's speculative config (`"model": "{dir}"`), the one `serve` shows and
            `draftsmith engine-eval` starts vLLM with; None for the other engines.
        served_depths: the `num_speculative_tokens` vLLM serves this layout with, `(fewest, most)` (None: no
            limit): Medusa's heads, P-EAGLE's trained depths and DFlash's block bound it.
        depth_choice: how `num_speculative_tokens` was chosen (ship/export.py `choose_depth`), recorded in
            draftsmith_export.json; None when the layout has no speculative config.
    """

    layout: str
    engine: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    weights_file: str = "model.safetensors"
    serve: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Callable[[Path], None]] = field(default_factory=dict)
    layer_ids: dict[str, list[int]] | None = None
    speculative: dict[str, Any] | None = None
    served_depths: tuple[int, int | None] = (1, None)
    depth_choice: dict[str, Any] | None = None


def vllm_speculative(method: str, depth: int, model: bool = True, **extra: Any) -> dict[str, Any]:
    """vLLM's `--speculative-config` for an export in `{dir}` (no model: the target carries the drafter)."""
    return {
        "method": method,
        **({"model": "{dir}"} if model else {}),
        "num_speculative_tokens": depth,
        **extra,
    }


def vllm_serve(target: str, speculative: dict[str, Any]) -> str:
    """The `vllm serve` command for `target` with `speculative`."""
    return f"vllm serve {target} --speculative-config '{json.dumps(speculative)}'"


def without_identity_vocab_map(tensors: dict[str, torch.Tensor], spec: LayoutSpec, vocab_size: int) -> None:
    """Drop `d2t` / `t2d` from a vLLM export whose drafter drafts the target's whole vocabulary.

    vLLM (0.32: llama_eagle3.py, qwen3_dflash.py) creates its `draft_id_to_target_id` parameter only when
    `draft_vocab_size` differs from the target's vocabulary, and refuses to load a `d2t` it has no parameter for
    ("There is no module or parameter named 'draft_id_to_target_id'"); without a map it drafts target ids."""
    if spec.draft_vocab is None or spec.draft_vocab[2] != vocab_size:
        return
    d2t, t2d, _ = spec.draft_vocab
    for name in (d2t, t2d):
        if name is not None:
            tensors.pop(name, None)
            spec.tensors.pop(name, None)
            spec.dtypes.pop(name, None)
    spec.draft_vocab = None


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=0, abs_tol=0)
    return bool(a == b)


def validate(export: Export, spec: LayoutSpec, target: TargetInfo) -> list[str]:
    """Check `export` against `spec` and the target; return the checks that passed.

    Raises:
        ExportError: listing every problem found (names, shapes, config values, vocabulary map, shared
            tensors, non-finite values).
    """
    problems: list[str] = []
    passed: list[str] = []
    for check in CHECKS:
        check(export, spec, target, problems, passed)
    if problems:
        raise ExportError(
            f"{export.layout}: the export would load but not compute what was trained; nothing was written:\n- "
            + "\n- ".join(problems)
        )
    return passed


def _elided(names: list[str]) -> str:
    """At most six names, then ' ...' when there are more."""
    return f"{names[:6]}{' ...' if len(names) > 6 else ''}"


def _check_names(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """Every tensor the engine loads is present, and none it does not know."""
    names = set(export.tensors)
    missing = sorted(set(spec.tensors) - names)
    unknown = sorted(names - set(spec.tensors) - set(spec.optional))
    if missing:
        problems.append(f"missing tensors the engine loads: {_elided(missing)}")
    if unknown:
        problems.append(f"tensors the engine does not know (it would skip them silently): {_elided(unknown)}")
    if not missing and not unknown:
        passed.append(f"{len(spec.tensors)} required tensors present with the engine's shapes, none unknown")


def _check_tensors(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """Each tensor has the engine's shape and dtype (floating point unless the spec names one), all finite."""
    shapes = {**spec.optional, **spec.tensors}
    for name, tensor in export.tensors.items():
        want = shapes.get(name)
        if want is not None and tuple(tensor.shape) != tuple(want):
            problems.append(f"{name} has shape {tuple(tensor.shape)}, the engine expects {tuple(want)}")
        dtype = spec.dtypes.get(name)
        if dtype is not None and tensor.dtype != dtype:
            problems.append(f"{name} has dtype {tensor.dtype}, the engine expects {dtype}")
        if dtype is None and not tensor.is_floating_point():
            problems.append(f"{name} has dtype {tensor.dtype}; weights must be floating point")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            problems.append(f"{name} has NaN or infinite values")


def _check_config(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """Every config.json value the engine reads is present and equals what the target requires."""
    for key, want in spec.config.items():
        got = _get(export.config, key)
        if got is _MISSING:
            problems.append(f"config.json lacks {key!r} (the engine needs {want!r})")
        elif not _same(got, want):
            problems.append(f"config.json has {key}={got!r}; the target requires {want!r}")
    if spec.config:
        passed.append("config values the engine reads match the target: " + ", ".join(sorted(spec.config)))


def _check_shared(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """Tensors the engine compares with or takes from the target (and any embed_tokens) are the target's."""
    for name, what in {**spec.shared, **_stray_embeddings(export, spec)}.items():
        if name not in export.tensors:
            continue
        tensor = export.tensors[name]
        reference = target.embedding() if what == "embedding" else target.lm_head()
        if tuple(tensor.shape) != tuple(reference.shape) or not torch.equal(
            tensor.to(reference.dtype), reference
        ):
            problems.append(f"{name} is not bit-identical to the target's {what}")
        else:
            passed.append(f"{name} is bit-identical to the target's {what}")


def _check_no_embedding(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """Record that the engine will use the target's embedding when the export carries none."""
    if not spec.own_embedding and not any(n.endswith("embed_tokens.weight") for n in export.tensors):
        passed.append("no embed_tokens: the engine uses the target's embedding")


def _stray_embeddings(export: Export, spec: LayoutSpec) -> dict[str, str]:
    """Any embed_tokens the export carries beyond the spec's shared ones must also be the target's."""
    if spec.own_embedding:
        return {}
    return {
        n: "embedding" for n in export.tensors if n.endswith("embed_tokens.weight") and n not in spec.shared
    }


def _check_vocab_map(
    export: Export, spec: LayoutSpec, target: TargetInfo, problems: list[str], passed: list[str]
) -> None:
    """A pruned draft vocabulary has a `d2t` onto distinct target ids, consistent with `t2d` when present."""
    if spec.draft_vocab is None:
        return
    tensors, vocab_size = export.tensors, target.vocab_size
    d2t_name, t2d_name, vd = spec.draft_vocab
    d2t = tensors.get(d2t_name)
    if d2t is None:
        if vd < vocab_size:
            problems.append(
                f"no {d2t_name}: the draft vocabulary has {vd} of the target's {vocab_size} tokens, and an engine "
                f"without the map reads draft id i as target id i (NeMo-Automodel#2447)"
            )
        return
    ids = torch.arange(d2t.shape[0]) + d2t.long()
    if d2t.shape[0] != vd:
        problems.append(f"{d2t_name} has {d2t.shape[0]} entries for a {vd}-token draft vocabulary")
        return
    if bool((ids < 0).any() or (ids >= vocab_size).any()) or ids.unique().numel() != vd:
        problems.append(
            f"{d2t_name} maps draft ids to target ids outside 0..{vocab_size - 1} or to one id twice"
        )
        return
    if t2d_name is not None and t2d_name in tensors:
        t2d = tensors[t2d_name]
        if not torch.equal(t2d.bool().nonzero().flatten(), ids.sort().values):
            problems.append(f"{t2d_name} does not mark exactly the target ids of {d2t_name}")
            return
    passed.append(
        f"{d2t_name} maps the {vd} draft ids to {vd} distinct target ids"
        + (f", consistent with {t2d_name}" if t2d_name else "")
    )


# The checks `validate` runs, in order: each appends what it found wrong to `problems` and what it verified
# to `passed`.
CHECKS: tuple[Callable[[Export, LayoutSpec, TargetInfo, list[str], list[str]], None], ...] = (
    _check_names,
    _check_tensors,
    _check_config,
    _check_vocab_map,
    _check_shared,
    _check_no_embedding,
)


EXPORT_RECORD = "draftsmith_export.json"  # the export's record: layout, checks, serve commands, its files


def write_export(export: Export, out: str | Path, source: dict[str, Any], passed: list[str]) -> Path:
    """Write a validated export atomically (a temporary sibling renamed into place)."""
    out = Path(out)
    with atomic_dir(out) as tmp:
        state = {k: v.detach().to("cpu").contiguous().clone() for k, v in export.tensors.items()}
        save_file(state, str(tmp / export.weights_file), metadata={"format": "pt"})
        write_json(tmp / "config.json", export.config, sort_keys=True)
        for writer in export.extra.values():
            writer(tmp)
        info = {
            "draftsmith_version": draftsmith_version(),
            "layout": export.layout,
            "engine": export.engine,
            "source": source,
            "layer_ids": export.layer_ids,
            "validation": passed,
            "serve": export.serve,
            "speculative_config": export.speculative,
            "speculative_depth": export.depth_choice,
            "notes": export.notes,
            # every file written, so that the next export into `out` replaces only these (files.py)
            "files": file_manifest(tmp, leave_out=(EXPORT_RECORD,)),
        }
        write_json(tmp / EXPORT_RECORD, info)
    return out
