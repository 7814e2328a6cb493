"""The evaluator's acceptance reports as ship finds and reads them: the files given, else the checkpoint's
`eval.json` (what `draftsmith eval --save-eval` writes). `push` cites them on the model card; `export` writes
the first one's recommended depth (eval/depth.py) as vLLM's `num_speculative_tokens`. Reports are read as JSON:
ship imports nothing of the evaluator."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT_NAME = "eval.json"


def data_label(data: Any) -> Any:
    """A data set as the card names it: its file with the folder holding it (`gsm8k/test.jsonl`,
    `mt_bench/question.jsonl`), since a file's own name is often generic. The folder is left out where it says
    nothing about the data and may name a user: the home, the temporary directory, the filesystem root. A
    missing name (not text) comes back as it is."""
    if not isinstance(data, str) or not data:
        return data
    path = Path(data).expanduser()
    parent = path.parent
    bare = parent in (Path("."), Path(parent.anchor), Path.home(), Path(tempfile.gettempdir()))
    return path.name if bare else f"{parent.name}/{path.name}"


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
