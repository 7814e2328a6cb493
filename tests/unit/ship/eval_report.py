"""An evaluator report as `draftsmith eval --save-eval` writes it (the fields the card and push read), shared
by the ship tests."""

from typing import Any

REPORT: dict[str, Any] = {
    "tau": 1.734,
    "tau_stderr": 0.041,
    "alpha": 0.289,
    "speedup": 1.27,
    "lossless": True,
    "num_prompts": 20,
    "acceptance_by_depth": [0.61, 0.42, 0.3],
    "settings": {
        "data": "mt_bench.jsonl",
        "temperature": 0.0,
        "top_p": 1.0,
        "depth": 3,
        "tree": "chain",
        "seed": 0,
        "versions": {
            "draftsmith": "0.1.0",
            "torch": "2.13.0+cpu",
            "transformers": "5.23.0",
            "device_name": "cpu",
        },
    },
}


def measured(ckpt, data: str = "mt_bench.jsonl") -> dict:
    """The `measured` record `draftsmith eval` writes of the checkpoint in `ckpt` (models/claims.py): its
    weights' sha256, its target's identity, the data."""
    import json
    from pathlib import Path

    from draftsmith.models.claims import drafter_record

    config = json.loads((Path(ckpt) / "config.json").read_text())
    return {
        "drafter": drafter_record(str(ckpt), config["kind"]),
        "target": config["target"],
        "data": {"source": data, "sha256": None, "prompts": 20},
    }


def of(ckpt, report: dict) -> dict:
    """`report` as a measurement of the checkpoint in `ckpt`."""
    return {**report, "measured": measured(ckpt, report.get("settings", {}).get("data", "mt_bench.jsonl"))}
