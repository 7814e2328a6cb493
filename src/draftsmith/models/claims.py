"""What a measurement claims, and the checks that refuse a claim about something it did not measure.

`draftsmith eval` writes into every report a `measured` record of what it measured:

    measured.drafter   {"name", "kind", "baseline", "weights_sha256"}: the checkpoint's recorded weight digests
                       (or, for a transformers draft LM directory, its weight files' sha256); a baseline (ngram,
                       self) has none and `baseline: true`
    measured.target    the target's identity (models/identity.py: sizes, tokenizer, weights fingerprint)
    measured.data      {"source", "sha256", "prompts", "turns", "prompt_tokens", "new_tokens"}

`push`, `export --report`, `gate`, `data needed` and the model card read reports as JSON and check them here:
against the checkpoint they are said to describe (the same weights, the same target), against each other (the
same target, the same data), and for values a measurement can have (a finite tau of at least 1, a recommended
depth that was measured). Each refusal is one line naming the file and the mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from draftsmith.runtime.files import read_json, sha256_file

from .families import FAMILIES

# Whose costs a recommendation rests on (`depth_costs` in a report, eval/depth.py): the evaluator's own loop
# (Python, transformers forwards, one draft step at a time) is not a serving engine's, whose verdict
# `engine-eval --depths` measures.
EVALUATOR_COSTS = "draftsmith's evaluator loop"
SELF = "self"  # the evaluator's sanity check: the target drafting for itself (no family: nothing of its own)


def baseline_title(name: str) -> str | None:
    """What a baseline is called on a card ("ngram (n-gram prompt lookup)"), or None for a trained drafter: a
    baseline is a family with nothing trained (models/families.py), or the target drafting for itself."""
    if name == SELF:
        return "self (the target drafting for itself)"
    record = FAMILIES.get(name)
    return f"{name} ({record.title})" if record is not None and record.train_method is None else None


def baseline_names() -> list[str]:
    return [k for k in FAMILIES if baseline_title(k)] + [SELF]


TARGET_KEYS = ("vocab_size", "hidden_size", "num_layers", "tokenizer_sha256", "weights_sha256")
# How a report was measured: two reports that differ here measured different things.
SETTING_KEYS = ("num_prompts", "max_new_tokens", "temperature", "top_p", "top_k", "tree", "depth", "seed")


class ClaimError(ValueError):
    """A report that does not describe what it is offered as (printed as one line)."""


def checkpoint_digest(ckpt_dir: str | Path) -> dict[str, str] | None:
    """The weight digests a drafter directory records when it is written (`{file: sha256}`): a draftsmith
    checkpoint's config.json, a distilled draft LM's draftsmith.json; else, for a transformers directory, the
    sha256 of its weight files; None for a directory without weights."""
    path = Path(ckpt_dir).expanduser()
    for meta in ("config.json", "draftsmith.json"):
        record = read_json(path / meta) if (path / meta).is_file() else None
        if (
            isinstance(record, dict)
            and isinstance(record.get("weights_sha256"), dict)
            and ("kind" in record or meta != "config.json")
        ):
            return dict(record["weights_sha256"])
    weights = sorted(p for p in path.glob("*.safetensors") if p.is_file()) if path.is_dir() else []
    return {p.name: sha256_file(p) for p in weights} or None


def drafter_record(name: str, kind: str | None) -> dict[str, Any]:
    """`measured.drafter` of an evaluation of the drafter `name` (a directory, or a baseline's name)."""
    if baseline_title(name):
        return {"name": name, "kind": name, "baseline": True, "weights_sha256": None}
    return {"name": name, "kind": kind, "baseline": False, "weights_sha256": checkpoint_digest(name)}


def is_baseline(report: dict[str, Any]) -> bool:
    """Whether `report` measured a baseline (ngram, self) rather than a trained drafter."""
    drafter = (report.get("measured") or {}).get("drafter") or {}
    if "baseline" in drafter:
        return bool(drafter["baseline"])
    named = (report.get("settings") or {}).get("drafter") or report.get("drafter")
    return isinstance(named, str) and baseline_title(named) is not None


def drafter_label(report: dict[str, Any]) -> str:
    """A baseline's name as a card or a table cites it ("ngram (prompt lookup)")."""
    name = ((report.get("measured") or {}).get("drafter") or {}).get("name") or (
        report.get("settings") or {}
    ).get("drafter")
    return baseline_title(str(name)) or str(name)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_values(report: Any, where: str) -> dict[str, Any]:
    """Refuse what no measurement writes: not a JSON object, no tau or settings, a tau that is not a finite
    number of at least 1 (tokens per verification step), a negative or non-finite standard error, acceptance
    rates outside 0..1, a recommended depth that is not a whole number within the depths measured."""
    if not isinstance(report, dict) or "tau" not in report or not isinstance(report.get("settings"), dict):
        raise ClaimError(
            f"{where} is not a `draftsmith eval` report (no tau and settings); write one with --report"
        )
    tau = report["tau"]
    if tau is not None and not (_finite(tau) and tau >= 1.0):
        raise ClaimError(
            f"{where}: tau {tau!r} is not a measured tau (a finite number of tokens per step, >= 1)"
        )
    err = report.get("tau_stderr")
    if err is not None and not (_finite(err) and err >= 0):
        raise ClaimError(f"{where}: tau_stderr {err!r} is not a standard error (a finite number >= 0)")
    rates = report.get("acceptance_by_depth") or []
    if not isinstance(rates, list) or any(r is not None and not (_finite(r) and 0 <= r <= 1) for r in rates):
        raise ClaimError(f"{where}: acceptance_by_depth {rates!r} holds values that are not rates in 0..1")
    check_recommendation(report, where)
    return report


def check_recommendation(report: dict[str, Any], where: str) -> None:
    """A recommended depth is None, 0 (off) or a depth the report predicted a speedup for."""
    depth = report.get("recommended_depth")
    if depth is None:
        return
    speedups = report.get("expected_speedup_by_depth") or []
    if not isinstance(depth, int) or isinstance(depth, bool):
        raise ClaimError(f"{where}: recommended_depth {depth!r} is not a depth (a whole number; 0 = off)")
    if not isinstance(speedups, list) or not 0 <= depth <= len(speedups):
        raise ClaimError(
            f"{where}: recommended_depth {depth} was not measured (the report predicts depths 1..{len(speedups)})"
        )
    speedup = report.get("recommended_speedup")
    if depth and not (_finite(speedup) and speedup is not None and speedup > 0):
        raise ClaimError(f"{where}: recommended_speedup {speedup!r} is not a speedup (a finite number > 0)")


def target_of(report: dict[str, Any]) -> dict[str, Any] | None:
    """The identity of the target a report measured on (older reports: `settings.target_identity`)."""
    found = (report.get("measured") or {}).get("target") or (report.get("settings") or {}).get(
        "target_identity"
    )
    return found if isinstance(found, dict) else None


def target_difference(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """The first identity field on which two targets differ ("tokenizer_sha256 1a2b3c... vs 4d5e6f..."), or
    None when every field both record agrees."""
    for key in TARGET_KEYS:
        x, y = (a or {}).get(key), (b or {}).get(key)
        if x is not None and y is not None and x != y:
            return f"{key} {str(x)[:12]} vs {str(y)[:12]}"
    return None


def check_of_checkpoint(
    report: dict[str, Any], where: str, ckpt_dir: str | Path, ckpt_target: dict[str, Any]
) -> None:
    """Refuse an evaluator report offered as a measurement of the drafter in `ckpt_dir` (trained for
    `ckpt_target`) that is no measurement (`check_values`), or that measured a baseline, another drafter (its
    weights' sha256 differ: another checkpoint, or this one retrained since), no recorded drafter at all, or
    another target."""
    check_values(report, where)
    check_measured_drafter(report, where, ckpt_dir, ckpt_target)


def check_engine_of_checkpoint(
    report: Any, where: str, ckpt_dir: str | Path, kind: str, ckpt_target: dict[str, Any]
) -> None:
    """The same for an `engine-eval` report (vLLM's measurement): it must be one, of a drafter of this kind,
    with these weights, on this target."""
    if not isinstance(report, dict) or not {"engine", "kind", "settings"} <= set(report):
        raise ClaimError(
            f"{where} is not a `draftsmith engine-eval --report` file (no engine, kind, settings)"
        )
    if report["kind"] != kind:
        raise ClaimError(f"{where} measured a drafter of kind {report['kind']}; {ckpt_dir} holds a {kind}")
    check_measured_drafter(report, where, ckpt_dir, ckpt_target)


def check_measured_drafter(
    report: dict[str, Any], where: str, ckpt_dir: str | Path, ckpt_target: dict[str, Any]
) -> None:
    """Refuse a report of a baseline, of no recorded drafter, of other weights than `ckpt_dir` holds, or of
    another target than `ckpt_target`."""
    if is_baseline(report):
        raise ClaimError(
            f"{where} measures {drafter_label(report)}, not the drafter in {ckpt_dir}; a baseline is cited as "
            f"one (`push --baseline-eval`); pass a report of this drafter (`draftsmith eval --drafter {ckpt_dir} "
            "... --save-eval`)"
        )
    measured = ((report.get("measured") or {}).get("drafter") or {}).get("weights_sha256")
    if not measured:
        raise ClaimError(
            f"{where} does not record which drafter it measured (no measured.drafter.weights_sha256: written by an "
            f"older draftsmith); measure {ckpt_dir} again with `draftsmith eval ... --save-eval`"
        )
    ours = checkpoint_digest(ckpt_dir)
    if ours is not None and measured != ours:
        raise ClaimError(
            f"{where} measured other weights than {ckpt_dir} holds (sha256 {_digest(measured)} measured, "
            f"{_digest(ours)} now): another drafter, or this one changed since; measure it again"
        )
    differ = target_difference(target_of(report), ckpt_target)
    if differ:
        raise ClaimError(f"{where} was measured on another target than {ckpt_dir} was trained for ({differ})")


def _digest(weights: dict[str, str]) -> str:
    return ", ".join(str(v)[:12] for _, v in sorted(weights.items()))


def data_of(report: dict[str, Any]) -> dict[str, Any]:
    """What a report measured on: its data source and content, the prompts, and the settings of SETTING_KEYS."""
    settings, data = report.get("settings") or {}, (report.get("measured") or {}).get("data") or {}
    return {
        "data": settings.get("data"),
        "data sha256": data.get("sha256"),
        "prompts measured": report.get("num_prompts"),
        **{k: settings.get(k) for k in SETTING_KEYS},
    }


def _same_file(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """Whether two reports' data (`data_of`) name one file two ways: the same last path part, the same bytes."""
    names, content = (x["data"], y["data"]), x["data sha256"]
    if content is None or content != y["data sha256"] or not all(isinstance(n, str) for n in names):
        return False
    return PurePosixPath(names[0]).name == PurePosixPath(names[1]).name


def alike_difference(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = ()) -> str | None:
    """The first way two reports were not measured alike (data, its content, prompts, decoding settings but
    `ignore`, target), as "key: A vs B"; None when they were. A content hash only one of them records is not
    compared. One file named relatively in one run and absolutely in another is the same data: names that end
    alike over the same recorded content are not compared (`hf:DIR:train` and `hf:DIR:test` end differently:
    a folder's hash covers every split)."""
    x, y = data_of(a), data_of(b)
    for key in x:
        if key in ignore or (key == "data sha256" and (x[key] is None or y[key] is None)):
            continue
        if key == "data" and _same_file(x, y):
            continue
        if x[key] != y[key]:
            return f"{key}: {x[key]!r} vs {y[key]!r}"
    differ = target_difference(target_of(a), target_of(b))
    return f"target: {differ}" if differ else None


def check_alike(reports: Sequence[tuple[str, dict[str, Any]]], what: str) -> None:
    """Refuse reports (`(where, report)`) that were not all measured alike, naming the first pair that differ."""
    for (first, a), (other, b) in zip(reports, reports[1:], strict=False):
        differ = alike_difference(a, b)
        if differ:
            raise ClaimError(f"{first} and {other} were not measured alike ({differ}); {what}")


def check_baseline(
    report: dict[str, Any], where: str, ckpt_target: dict[str, Any], drafter_reports: Sequence[dict[str, Any]]
) -> None:
    """Refuse a report offered as a baseline (`push --baseline-eval`) that measured a trained drafter, another
    target, or other prompts and settings than every report of the drafter it is cited beside (its tree and
    depth may differ: prompt lookup drafts as engines run it)."""
    check_values(report, where)
    if not is_baseline(report):
        raise ClaimError(
            f"{where} measured a trained drafter, not a baseline ({', '.join(baseline_names())}); pass a drafter's "
            "report with --eval"
        )
    differ = target_difference(target_of(report), ckpt_target)
    if differ:
        raise ClaimError(f"{where} was measured on another target than the drafter's ({differ})")
    differences = [alike_difference(r, report, ignore=("tree", "depth")) for r in drafter_reports]
    if drafter_reports and all(differences):
        raise ClaimError(
            f"{where} was not measured like any report of the drafter ({differences[0]}); measure the baseline "
            "on the same prompts and settings"
        )
