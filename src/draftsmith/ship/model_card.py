"""The Hub model card of a drafter: YAML metadata, then what was measured, how it was trained, how to serve it.

Every figure comes from the files it is built from: the acceptance reports (`eval.json`, written by
`draftsmith eval --save-eval`), the checkpoint's config (drafter settings, target identity, held-out training
metrics, the resolved recipe) and the exports' `draftsmith_export.json` (layouts, validation, serving commands).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from draftsmith.models.claims import EVALUATOR_COSTS, drafter_label, is_baseline
from draftsmith.models.families import Family, family
from draftsmith.runtime.display import fmt_value as _fmt
from draftsmith.runtime.display import table

from .reports import data_label
from .serve_depth import combined_depths, measured_speedups

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# The tau table's columns: what was measured, under what, then what it measured.
SETTING_COLUMNS = ["drafter", "data", "prompts", "T", "top-p", "depth", "tree", "seed"]
FIGURE_COLUMNS = ["tau", "± s.e.", "alpha", "speedup", "lossless"]


def tau_table(reports: list[dict[str, Any]], baselines: Sequence[dict[str, Any]] = ()) -> list[str]:
    """One row per acceptance report: its settings and measured figures (tau in bold); the drafter's reports
    first, then each baseline's (ngram's), named as the baseline it is."""
    rows = []
    for r in [*reports, *baselines]:
        s = r.get("settings", {})
        rows.append(
            [
                f"{drafter_label(r)} (baseline)" if is_baseline(r) else "this drafter",
                data_label(s.get("data", "-")),
                r.get("num_prompts", "-"),
                _fmt(s.get("temperature"), 1),
                _fmt(s.get("top_p"), 2),
                s.get("depth", "-"),
                s.get("tree", "-"),
                s.get("seed", "-"),
                f"**{_fmt(r.get('tau'))}**",
                _fmt(r.get("tau_stderr")),
                _fmt(r.get("alpha")),
                _fmt(r.get("speedup"), 2),
                _fmt(r.get("lossless")),
            ]
        )
    return table(SETTING_COLUMNS + FIGURE_COLUMNS, rows)


def depth_table(reports: list[dict[str, Any]]) -> list[str]:
    """Acceptance at each draft depth, one row per report, as deep as the deepest report; none without depths."""
    depth = max((len(r.get("acceptance_by_depth") or []) for r in reports), default=0)
    if depth == 0:
        return []
    rows = []
    for r in reports:
        s = r.get("settings", {})
        acc = list(r.get("acceptance_by_depth") or []) + [None] * depth
        rows.append(
            [data_label(s.get("data", "-")), _fmt(s.get("temperature"), 1), *(_fmt(a) for a in acc[:depth])]
        )
    return table(["data", "T", *(f"depth {k}" for k in range(1, depth + 1))], rows)


def recommendation_table(reports: list[dict[str, Any]]) -> list[str]:
    """The draft depth each report recommends (`recommended_depth`, eval/depth.py) and its expected speedup, one
    row per report that has one; none without."""
    rows = []
    for r in reports:
        depth = r.get("recommended_depth")
        if depth is None:
            continue
        s = r.get("settings", {})
        device = s.get("versions", {}).get("device_name", "-")
        costs = r.get("depth_costs") or EVALUATOR_COSTS  # reports before the key: the evaluator's
        cells = [data_label(s.get("data", "-")), _fmt(s.get("temperature"), 1), *_recommended_cells(r)]
        rows.append([*cells, costs, device])
    if not rows:
        return []
    return table(["data", "T", "recommended depth", "expected speedup", "costs of", "device"], rows)


def _recommended_cells(report: dict[str, Any]) -> list[str]:
    """The depth and expected-speedup cells: "off" and the best depth's figure when no depth pays."""
    speedups = report.get("expected_speedup_by_depth") or []
    if report["recommended_depth"] == 0:
        best = max(range(len(speedups)), key=lambda i: speedups[i], default=None)
        shown = f"no depth pays (best {best + 1}: {_fmt(speedups[best], 2)}x)" if best is not None else "-"
        return ["off", shown]
    return [str(report["recommended_depth"]), f"{_fmt(report.get('recommended_speedup'), 2)}x"]


def versions_line(reports: list[dict[str, Any]]) -> str:
    """The draftsmith, torch and transformers versions and the device of the reports, each distinct line once."""
    seen = []
    for r in reports:
        v = r.get("settings", {}).get("versions", {})
        line = ", ".join(
            f"{k} {v[k]}" for k in ("draftsmith", "torch", "transformers", "device_name") if k in v
        )
        if line and line not in seen:
            seen.append(line)
    return "; ".join(seen) or "not recorded"


def _run_recipe(ckpt_dir: Path) -> dict[str, Any] | None:
    """The resolved recipe of the training run a `final/` checkpoint came from (its run directory's config.yaml),
    for checkpoints written before the recipe was stored in them."""
    path = Path(ckpt_dir).parent / "config.yaml"
    return yaml.safe_load(path.read_text()) if Path(ckpt_dir).name == "final" and path.is_file() else None


def render_card(
    repo: str,
    source: dict[str, Any],
    reports: list[dict[str, Any]],
    exports: dict[str, dict[str, Any]],
    license_id: str,
    engines: Sequence[dict[str, Any]] = (),
    baselines: Sequence[dict[str, Any]] = (),
) -> str:
    """README.md for `repo` (see the module docstring); `engines`: `engine-eval` reports (one per data set),
    whose vLLM figures get a section of their own; `baselines`: baselines' reports (ngram's), cited beside the
    drafter's by name."""
    record = family(source["kind"])
    base = source["target"].get("name_or_path", "")
    out = _front_matter(record, base, license_id)
    out += _introduction(repo, record, base, source["config"])
    out += _measured_section(reports, baselines)
    out += _engine_section(engines[0]) if len(engines) == 1 else _engine_sets_section(engines)
    out += _drafter_section(source, record, base)
    out += _training_section(source)
    out += _serve_section(repo, exports)
    out += _measure_again(repo, base)
    return "\n".join(out)


def _front_matter(record: Family, base: str, license_id: str) -> list[str]:
    """The YAML metadata the Hub reads (base_model only for a target known by its Hub id)."""
    meta: dict[str, Any] = {
        "library_name": "draftsmith",
        "license": license_id,
        "pipeline_tag": "text-generation",
        "tags": ["speculative-decoding", "draftsmith", *record.tags],
    }
    if HUB_ID.match(base) and not Path(base).exists():
        meta["base_model"] = base
    return ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", ""]


def _introduction(repo: str, record: Family, base: str, config: dict[str, Any]) -> list[str]:
    """The title and the sentence saying what the drafter is for."""
    title = record.title
    return [
        f"# {repo.split('/')[-1]}",
        "",
        f"{'An' if title[0] in 'AEIOU' else 'A'} {title} for **{base}**, trained and measured with "
        f"draftsmith {config.get('draftsmith_version', '')}. It drafts tokens that the "
        "target verifies: outputs are the target's own (lossless at every temperature).",
        "",
    ]


def _measured_section(reports: list[dict[str, Any]], baselines: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The acceptance tables of the reports, or the statement that nothing was measured."""
    out = ["## Measured acceptance", ""]
    if not reports:
        return out + ["**Not measured.** This drafter was pushed without an acceptance report.", ""]
    out += [
        "Real speculative decoding against the target on held-out prompts (`draftsmith eval`). tau = "
        "tokens committed per target forward, bonus token included; alpha = accepted / proposed draft "
        "tokens; speedup = tokens/s against plain decoding of the same prompts on the machine named "
        "below (a CPU figure says nothing about GPU serving).",
        "",
    ]
    out += tau_table(reports, baselines) + [""]
    depths = depth_table(reports)
    if depths:
        out += (
            ["Acceptance at each draft depth (given the earlier depths were accepted):", ""] + depths + [""]
        )
    recommended = recommendation_table(reports)
    if recommended:
        out += [
            "The draft depth to serve (vLLM's `num_speculative_tokens`; the vLLM export uses the first report's, "
            "unless vLLM's own measurement below timed several depths): "
            "the one with the highest expected speedup, predicted from the acceptance at each depth and the "
            "measured cost of a draft step and of a verification on the device named, in the loop the "
            "`costs of` column names; off when no depth beats plain decoding. draftsmith's evaluator loop drafts "
            "one token at a time in Python: its costs are not a serving engine's, and vLLM's own measurement "
            "(below, where given) is the serving verdict.",
            "",
            *recommended,
            "",
        ]
    return out + [f"Versions and device: {versions_line(reports)}.", ""]


def _engine_section(report: dict[str, Any]) -> list[str]:
    """vLLM's own measurement (`draftsmith engine-eval`): its tau next to the evaluator's, the answers equal to
    plain decoding, and the speedup at each depth it decoded (`--depths`), or at the run's one depth."""
    v, settings, n = report["vllm"], report["settings"], report["answers"]
    equal = v.get("speculative_equals_plain")
    out = [
        "## Measured in vLLM",
        "",
        f"Served by {report['engine']['package']} {report['engine']['version']} (`draftsmith engine-eval`): {n} "
        f"answers of {data_label(settings['data'])}, T = {settings['temperature']}, batch "
        f"{settings['batch_size']}{_threads(report)}; plain decoding {_fmt(v['plain_tokens_per_s'], 1)} tokens/s. "
        "vLLM's "
        f"mean acceptance length {_fmt(v['mean_acceptance_length'])} at depth {settings['depth']} (the "
        f"evaluator's tau: {_fmt(report['draftsmith']['tau'])})"
        + (f"; {equal}/{n} answers equal to plain decoding." if equal is not None else "."),
        "",
    ]
    check = report.get("depth_check")
    if check:
        rows = [[r["depth"], _fmt(r["tau_vllm"]), _fmt(r["speedup_measured"], 2)] for r in check["rows"]]
        out += table(["depth", "vLLM mean acceptance length", "speedup against plain decoding"], rows)
        out += [
            "",
            f"Fastest depth measured: {check['fastest_measured_depth']} (what the vLLM export drafts).",
            "",
        ]
    else:
        out += [f"Speedup at depth {settings['depth']}: {_fmt(v['speedup'], 2)}x plain decoding.", ""]
    return out


def _threads(report: dict[str, Any]) -> str:
    """Where vLLM's OpenMP threads ran, when the report recorded a binding (engine-eval's `cpu_settings`): on a
    2-core CPU it changed plain decoding's speed 1.55x, so CPU figures under other bindings do not compare."""
    bound = (report["engine"].get("cpu_settings") or {}).get("VLLM_CPU_OMP_THREADS_BIND")
    return f", vLLM's OpenMP threads on CPUs {bound}" if bound else ""


def _engine_sets_section(reports: Sequence[dict[str, Any]]) -> list[str]:
    """vLLM's measurement on several data sets (`draftsmith engine-eval`, one report each): a row per set with
    plain decoding's rate, the answers equal to it and the measured speedup at each depth; none without
    reports."""
    if not reports:
        return []
    first = reports[0]
    out = [
        "## Measured in vLLM",
        "",
        f"Served by {first['engine']['package']} {first['engine']['version']} (`draftsmith engine-eval`), T = "
        f"{first['settings']['temperature']}, batch {first['settings']['batch_size']}{_threads(first)}; speedup "
        "against plain decoding at each depth vLLM drafted.",
        "",
    ]
    # each set's speedup per depth: its --depths runs, else its one run at the evaluator's depth
    speedups = [
        measured_speedups(rep) or {rep["settings"]["depth"]: rep["vllm"]["speedup"]} for rep in reports
    ]
    depths = sorted(set().union(*speedups))
    rows = []
    for rep, measured in zip(reports, speedups, strict=True):
        n, equal = rep["answers"], rep["vllm"].get("speculative_equals_plain")
        rows.append(
            [data_label(rep["settings"]["data"]), n, _fmt(rep["vllm"]["plain_tokens_per_s"], 1)]
            + [f"{_fmt(measured[k], 2)}x" if k in measured else "-" for k in depths]
            + [f"{equal}/{n}" if equal is not None else "-"]
        )
    headers = ["data", "answers", "plain tokens/s", *[f"depth {k}" for k in depths], "answers equal to plain"]
    out += table(headers, rows) + [""]
    combined = combined_depths(reports)
    if combined is not None:
        check = combined["depth_check"]
        best = next(r for r in check["rows"] if r["depth"] == check["fastest_measured_depth"])
        out += [
            f"Fastest depth over the {len(combined['sets'])} sets (geometric mean of their speedups): "
            f"{best['depth']}, {_fmt(best['speedup_measured'], 2)}x plain decoding (what the vLLM export drafts).",
            "",
        ]
    return out


def _drafter_section(source: dict[str, Any], record: Family, base: str) -> list[str]:
    """The drafter's kind, its target's identity, the features and vocabulary it reads, and its settings."""
    config, target = source["config"], source["target"]
    out = [
        "## Drafter",
        "",
        f"- kind: `{source['kind']}`",
        f"- target: `{base}` (revision {target.get('revision') or 'not pinned'}; "
        f"vocabulary {target.get('vocab_size')}, hidden size {target.get('hidden_size')}, "
        f"{target.get('num_layers')} layers; tokenizer sha256 `{str(target.get('tokenizer_sha256'))[:16]}…`)",
    ]
    if config.get("feature_layers") and record.feature_layers:
        out.append(f"- target features read (draftsmith canonical ids): {config['feature_layers']}")
    if config.get("draft_vocab_size") and record.vocab_map:
        out.append(f"- draft vocabulary: {config['draft_vocab_size']} tokens (mapped by `d2t` / `t2d`)")
    settings = config.get("drafter") or {k: v for k, v in config.items() if k not in ("target", "training")}
    return out + [f"- settings: `{json.dumps(settings, sort_keys=True)[:600]}`", ""]


def _training_section(source: dict[str, Any]) -> list[str]:
    """Steps, held-out metrics, data and the resolved recipe, as far as the checkpoint recorded them."""
    out = ["## Training", ""]
    training = source["config"].get("training", {})
    if not training:
        return out + ["Not recorded in this checkpoint."]
    out.append(f"- optimizer steps: {training.get('steps', '-')}")
    heldout = {k: v for k, v in (training.get("heldout") or {}).items() if "top1" in k or k.endswith("loss")}
    if heldout:
        shown = ", ".join(f"{k.removeprefix('eval/')} {_fmt(v)}" for k, v in list(heldout.items())[:8])
        out.append(f"- held-out teacher-forced metrics at the end: {shown}")
    recipe = training.get("recipe") or _run_recipe(source["dir"])
    if not recipe:
        return out + ["- recipe: not recorded in this checkpoint"]
    data = recipe.get("data", {})
    return out + [
        f"- training data: {data.get('train', '-')}; held out: {data.get('eval', '-')}",
        "",
        "<details><summary>Resolved recipe</summary>",
        "",
        "```yaml",
        yaml.safe_dump(recipe, sort_keys=False).strip(),
        "```",
        "",
        "</details>",
    ]


def _serve_section(repo: str, exports: dict[str, dict[str, Any]]) -> list[str]:
    """Per engine: how to download its layout and the commands that serve it, with its notes."""
    out = ["", "## Serve it", ""]
    out += ["Each engine's layout was validated against the target before upload (`draftsmith export`).", ""]
    for engine, info in exports.items():
        folder = info["folder"]
        where = f"drafter/{folder}" if folder else repo
        out += [f"**{engine}** ({info['layout']}):", "", "```bash"]
        if folder:
            out.append(f"hf download {repo} --include '{folder}/*' --local-dir drafter")
        for k, cmd in enumerate(info.get("serve", [])):  # two commands are two ways, not two steps
            out += (["# or:"] if k else []) + [cmd.replace("{dir}", where)]
        out += ["```", ""] + [f"- {note}" for note in info.get("notes", [])]
        out += [""] if info.get("notes") else []
    return out


def _measure_again(repo: str, base: str) -> list[str]:
    """The commands that measure the pushed drafter on a user's own prompts and gate it."""
    return [
        "Measure it again on your own prompts before deploying (exit status 3 when it fails the gate):",
        "",
        "```bash",
        f"draftsmith eval --target {base} --drafter {repo} --data YOUR_PROMPTS.jsonl --report new.json",
        "draftsmith gate --report new.json --baseline eval.json --min-tau 1.5",
        "```",
        "",
    ]
