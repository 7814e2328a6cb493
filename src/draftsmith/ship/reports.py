"""The evaluator's acceptance reports as ship finds and reads them: the files given, else the checkpoint's
`eval.json` (what `draftsmith eval --save-eval` writes). `push` cites them on the model card; `export` writes
the first one's recommended depth (eval/depth.py) as vLLM's `num_speculative_tokens`. Reports are read as JSON:
ship imports nothing of the evaluator."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT_NAME = "eval.json"


def report_files(ckpt_dir: Path, given: Sequence[Path] | None) -> list[Path]:
    """The reports of a checkpoint: `given` when there are any, else its eval.json when present, else none."""
    if given:
        return list(given)
    saved = Path(ckpt_dir) / REPORT_NAME
    return [saved] if saved.is_file() else []


def read_reports(files: Sequence[Path], option: str = "") -> list[dict[str, Any]]:
    """Each report file's JSON; one line naming the file (after `option`, the flag that gave it) that is not a
    readable report."""
    loaded = []
    for f in files:
        try:
            report = json.loads(Path(f).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{option} {f}: not a readable acceptance report ({err})".strip()) from err
        if not isinstance(report, dict):
            raise ValueError(f"{option} {f}: not an acceptance report (a JSON object)".strip())
        loaded.append(report)
    return loaded
