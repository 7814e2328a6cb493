"""The Hub model card of a drafter: YAML metadata, then what was measured, how it was trained, how to serve it.

Every figure comes from the files it is built from: the acceptance reports (`eval.json`, written by
`draftsmith eval --save-eval`), the checkpoint's config (drafter settings, target identity, held-out training
metrics, the resolved recipe) and the exports' `draftsmith_export.json` (layouts, validation, serving commands).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from draftsmith.models.families import family
from draftsmith.runtime.display import fmt_value as _fmt

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def tau_table(reports: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| data | prompts | T | top-p | depth | tree | seed | tau | ± s.e. | alpha | speedup | lossless |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        s = r.get("settings", {})
        rows.append(
            f"| {s.get('data', '-')} | {r.get('num_prompts', '-')} | {_fmt(s.get('temperature'), 1)} | "
            f"{_fmt(s.get('top_p'), 2)} | {s.get('depth', '-')} | {s.get('tree', '-')} | {s.get('seed', '-')} | "
            f"**{_fmt(r.get('tau'))}** | {_fmt(r.get('tau_stderr'))} | {_fmt(r.get('alpha'))} | "
            f"{_fmt(r.get('speedup'), 2)} | {_fmt(r.get('lossless'))} |"
        )
    return rows


def depth_table(reports: list[dict[str, Any]]) -> list[str]:
    depth = max((len(r.get("acceptance_by_depth") or []) for r in reports), default=0)
    if depth == 0:
        return []
    rows = [
        "| data | T | " + " | ".join(f"depth {k}" for k in range(1, depth + 1)) + " |",
        "|---|---|" + "---|" * depth,
    ]
    for r in reports:
        s = r.get("settings", {})
        acc = list(r.get("acceptance_by_depth") or []) + [None] * depth
        rows.append(
            f"| {s.get('data', '-')} | {_fmt(s.get('temperature'), 1)} | "
            + " | ".join(_fmt(a) for a in acc[:depth])
            + " |"
        )
    return rows


def versions_line(reports: list[dict[str, Any]]) -> str:
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
) -> str:
    """README.md for `repo` (see the module docstring)."""
    kind = source["kind"]
    record = family(kind)
    config = source["config"]
    target = source["target"]
    base = target.get("name_or_path", "")
    meta: dict[str, Any] = {
        "library_name": "draftsmith",
        "license": license_id,
        "pipeline_tag": "text-generation",
        "tags": ["speculative-decoding", "draftsmith", *record.tags],
    }
    if HUB_ID.match(base) and not Path(base).exists():
        meta["base_model"] = base
    training = config.get("training", {})
    out = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", ""]
    out += [f"# {repo.split('/')[-1]}", ""]
    title = record.title
    out += [
        f"{'An' if title[0] in 'AEIOU' else 'A'} {title} for **{base}**, trained and measured with "
        f"draftsmith {config.get('draftsmith_version', '')}. It drafts tokens that the "
        "target verifies: outputs are the target's own (lossless at every temperature).",
        "",
    ]
    out += ["## Measured acceptance", ""]
    if reports:
        out += [
            "Real speculative decoding against the target on held-out prompts (`draftsmith eval`). tau = "
            "tokens committed per target forward, bonus token included; alpha = accepted / proposed draft "
            "tokens; speedup = tokens/s against plain decoding of the same prompts on the machine named "
            "below (a CPU figure says nothing about GPU serving).",
            "",
        ]
        out += tau_table(reports) + [""]
        table = depth_table(reports)
        if table:
            out += (
                ["Acceptance at each draft depth (given the earlier depths were accepted):", ""]
                + table
                + [""]
            )
        out += [f"Versions and device: {versions_line(reports)}.", ""]
    else:
        out += ["**Not measured.** This drafter was pushed without an acceptance report.", ""]
    out += ["## Drafter", ""]
    out += [
        f"- kind: `{kind}`",
        f"- target: `{base}` (revision {target.get('revision') or 'not pinned'}; "
        f"vocabulary {target.get('vocab_size')}, hidden size {target.get('hidden_size')}, "
        f"{target.get('num_layers')} layers; tokenizer sha256 `{str(target.get('tokenizer_sha256'))[:16]}…`)",
    ]
    if config.get("feature_layers") and record.feature_layers:
        out.append(f"- target features read (draftsmith canonical ids): {config['feature_layers']}")
    if config.get("draft_vocab_size") and record.vocab_map:
        out.append(f"- draft vocabulary: {config['draft_vocab_size']} tokens (mapped by `d2t` / `t2d`)")
    settings = config.get("drafter") or {k: v for k, v in config.items() if k not in ("target", "training")}
    out += [f"- settings: `{json.dumps(settings, sort_keys=True)[:600]}`", ""]
    out += ["## Training", ""]
    if training:
        out.append(f"- optimizer steps: {training.get('steps', '-')}")
        heldout = {
            k: v for k, v in (training.get("heldout") or {}).items() if "top1" in k or k.endswith("loss")
        }
        if heldout:
            shown = ", ".join(f"{k.removeprefix('eval/')} {_fmt(v)}" for k, v in list(heldout.items())[:8])
            out.append(f"- held-out teacher-forced metrics at the end: {shown}")
        recipe = training.get("recipe") or _run_recipe(source["dir"])
        if recipe:
            data = recipe.get("data", {})
            out.append(f"- training data: {data.get('train', '-')}; held out: {data.get('eval', '-')}")
            out += [
                "",
                "<details><summary>Resolved recipe</summary>",
                "",
                "```yaml",
                yaml.safe_dump(recipe, sort_keys=False).strip(),
                "```",
                "",
                "</details>",
            ]
        else:
            out.append("- recipe: not recorded in this checkpoint")
    else:
        out.append("Not recorded in this checkpoint.")
    out += ["", "## Serve it", ""]
    out += ["Each engine's layout was validated against the target before upload (`draftsmith export`).", ""]
    for engine, info in exports.items():
        folder = info["folder"]
        where = f"drafter/{folder}" if folder else repo
        out += [f"**{engine}** ({info['layout']}):", "", "```bash"]
        if folder:
            out.append(f"hf download {repo} --include '{folder}/*' --local-dir drafter")
        out += [cmd.replace("{dir}", where) for cmd in info.get("serve", [])]
        out += ["```", ""] + [f"- {note}" for note in info.get("notes", [])]
        out += [""] if info.get("notes") else []
    out += [
        "Measure it again on your own prompts before deploying (exit status 3 when it fails the gate):",
        "",
        "```bash",
        f"draftsmith eval --target {base} --drafter {repo} --data YOUR_PROMPTS.jsonl --report new.json",
        "draftsmith gate --report new.json --baseline eval.json --min-tau 1.5",
        "```",
        "",
    ]
    return "\n".join(out)
