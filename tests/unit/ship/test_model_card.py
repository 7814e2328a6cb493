"""The model card's exact text: a card and the acceptance tables pinned as they were written before the
tables were built with runtime.display.table (issue 36), reports with missing or null fields included."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from eval_report import REPORT  # tests/unit/ship/, on the path

from draftsmith.ship.model_card import depth_table, recommendation_table, render_card, tau_table
from draftsmith.ship.reports import data_label

# Fields missing, a depth not measured (None), an integer figure; then fields present but null; then nothing.
SPARSE = {
    "tau": 2,
    "settings": {"data": "gsm8k.jsonl", "temperature": 0.7},
    "acceptance_by_depth": [0.5, 1, None, 0.25],
}
NULLS = {"num_prompts": None, "tau": None, "settings": {"data": None, "temperature": None, "depth": None}}

SOURCE = {
    "kind": "eagle3",
    "dir": Path("/nonexistent/final"),
    "config": {
        "draft_vocab_size": 64,
        "feature_layers": [1, 2, 3],
        "draftsmith_version": "0.1.0",
        "drafter": {"version": 3, "ttt_steps": 3},
        "training": {
            "steps": 292,
            "heldout": {"eval/depth1/top1": 0.374, "eval/loss": 1.5, "eval/lr": 0.1},
            "recipe": {
                "data": {"train": ["sharegpt.jsonl"], "eval": ["mt_bench.jsonl"]},
                "train": {"lr": 3e-4},
            },
        },
    },
    "target": {
        "name_or_path": "acme/tiny-llama",
        "revision": "abc123",
        "vocab_size": 400,
        "hidden_size": 64,
        "num_layers": 4,
        "tokenizer_sha256": "0123456789abcdef0123",
    },
}
EXPORTS = {
    "vllm": {
        "folder": "engines/vllm",
        "layout": "eagle3-vllm-speculators",
        "serve": ["vllm serve {dir}"],
        "notes": ["a note"],
    },
    "sglang": {
        "folder": "engines/sglang",
        "layout": "eagle3-sglang",
        "serve": ["python -m sglang.launch_server --speculative-draft-model-path {dir}"],
        "notes": [],
    },
}

CARD = """---
library_name: draftsmith
license: apache-2.0
pipeline_tag: text-generation
tags:
- speculative-decoding
- draftsmith
- eagle3
- eagle
base_model: acme/tiny-llama
---

# eagle3-tiny

An EAGLE-3 draft head for **acme/tiny-llama**, trained and measured with draftsmith 0.1.0. It drafts tokens that the target verifies: outputs are the target's own (lossless at every temperature).

## Measured acceptance

Real speculative decoding against the target on held-out prompts (`draftsmith eval`). tau = tokens committed per target forward, bonus token included; alpha = accepted / proposed draft tokens; speedup = tokens/s against plain decoding of the same prompts on the machine named below (a CPU figure says nothing about GPU serving).

| drafter | data | prompts | T | top-p | depth | tree | seed | tau | ± s.e. | alpha | speedup | lossless |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| this drafter | mt_bench.jsonl | 20 | 0.0 | 1.00 | 3 | chain | 0 | **1.734** | 0.041 | 0.289 | 1.27 | True |
| this drafter | gsm8k.jsonl | - | 0.7 | - | - | - | - | **2** | - | - | - | - |

Acceptance at each draft depth (given the earlier depths were accepted):

| data | T | depth 1 | depth 2 | depth 3 | depth 4 |
|---|---|---|---|---|---|
| mt_bench.jsonl | 0.0 | 0.610 | 0.420 | 0.300 | - |
| gsm8k.jsonl | 0.7 | 0.500 | 1 | - | 0.250 |

Versions and device: draftsmith 0.1.0, torch 2.13.0+cpu, transformers 5.23.0, device_name cpu.

## Drafter

- kind: `eagle3`
- target: `acme/tiny-llama` (revision abc123; vocabulary 400, hidden size 64, 4 layers; tokenizer sha256 `0123456789abcdef…`)
- target features read (draftsmith canonical ids): [1, 2, 3]
- draft vocabulary: 64 tokens (mapped by `d2t` / `t2d`)
- settings: `{"ttt_steps": 3, "version": 3}`

## Training

- optimizer steps: 292
- held-out teacher-forced metrics at the end: depth1/top1 0.374, loss 1.500
- training data: ['sharegpt.jsonl']; held out: ['mt_bench.jsonl']

<details><summary>Resolved recipe</summary>

```yaml
data:
  train:
  - sharegpt.jsonl
  eval:
  - mt_bench.jsonl
train:
  lr: 0.0003
```

</details>

## Serve it

Each engine's layout was validated against the target before upload (`draftsmith export`).

**vllm** (eagle3-vllm-speculators):

```bash
hf download acme/eagle3-tiny --include 'engines/vllm/*' --local-dir drafter
vllm serve drafter/engines/vllm
```

- a note

**sglang** (eagle3-sglang):

```bash
hf download acme/eagle3-tiny --include 'engines/sglang/*' --local-dir drafter
python -m sglang.launch_server --speculative-draft-model-path drafter/engines/sglang
```

Measure it again on your own prompts before deploying (exit status 3 when it fails the gate):

```bash
draftsmith eval --target acme/tiny-llama --drafter acme/eagle3-tiny --data YOUR_PROMPTS.jsonl --report new.json
draftsmith gate --report new.json --baseline eval.json --min-tau 1.5
```
"""


def test_the_card_text_is_exactly_as_written():
    assert render_card("acme/eagle3-tiny", SOURCE, [REPORT, SPARSE], EXPORTS, "apache-2.0") == CARD


def test_the_tables_write_missing_fields_as_a_dash_and_null_settings_as_recorded():
    # A null data / prompts / depth setting prints as "None", as the hand-built tables wrote it.
    assert tau_table([REPORT, SPARSE, NULLS, {}]) == [
        "| drafter | data | prompts | T | top-p | depth | tree | seed | tau | ± s.e. | alpha | speedup | lossless |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        "| this drafter | mt_bench.jsonl | 20 | 0.0 | 1.00 | 3 | chain | 0 | **1.734** | 0.041 | 0.289 | 1.27 | True |",
        "| this drafter | gsm8k.jsonl | - | 0.7 | - | - | - | - | **2** | - | - | - | - |",
        "| this drafter | None | None | - | - | None | - | - | **-** | - | - | - | - |",
        "| this drafter | - | - | - | - | - | - | - | **-** | - | - | - | - |",
    ]
    # a baseline's report is cited by name, after the drafter's
    ngram = {**REPORT, "tau": 1.29, "settings": {**REPORT["settings"], "drafter": "ngram"}}
    assert tau_table([REPORT], [ngram])[-1].startswith(
        "| ngram (n-gram prompt lookup) (baseline) | mt_bench.jsonl | 20 |"
    )
    assert depth_table([REPORT, SPARSE, NULLS, {}]) == [
        "| data | T | depth 1 | depth 2 | depth 3 | depth 4 |",
        "|---|---|---|---|---|---|",
        "| mt_bench.jsonl | 0.0 | 0.610 | 0.420 | 0.300 | - |",
        "| gsm8k.jsonl | 0.7 | 0.500 | 1 | - | 0.250 |",
        "| None | - | - | - | - | - |",
        "| - | - | - | - | - | - |",
    ]
    assert depth_table([NULLS, {}]) == []


def test_an_unmeasured_drafter_without_a_training_record():
    source = {"kind": "medusa", "dir": Path("/nonexistent/x"), "config": {"num_heads": 3}, "target": {}}
    exports = {"hf": {"folder": "", "layout": "medusa-hf", "serve": ["x {dir}"]}}
    card = render_card("acme/m", source, [], exports, "other")
    assert (
        "## Measured acceptance\n\n**Not measured.** This drafter was pushed without an acceptance report.\n"
        in card
    )
    assert (
        '- settings: `{"num_heads": 3}`\n\n## Training\n\nNot recorded in this checkpoint.\n\n## Serve it'
        in card
    )
    assert "**hf** (medusa-hf):\n\n```bash\nx acme/m\n```\n\nMeasure it again" in card


def test_the_card_states_the_recommended_depth_and_its_expected_speedup():
    pays = {**REPORT, "expected_speedup_by_depth": [1.45, 1.62, 1.6], "recommended_depth": 2}
    pays["recommended_speedup"] = 1.62
    off = {
        "settings": {"data": "gsm8k.jsonl", "temperature": 0.7, "versions": {"device_name": "NVIDIA H100"}},
        "expected_speedup_by_depth": [0.74, 0.81],
        "recommended_depth": 0,
        "recommended_speedup": 1.0,
    }
    tree = {**REPORT, "recommended_depth": None, "expected_speedup_by_depth": None}
    assert recommendation_table([pays, off, tree, SPARSE]) == [
        "| data | T | recommended depth | expected speedup | costs of | device |",
        "|---|---|---|---|---|---|",
        "| mt_bench.jsonl | 0.0 | 2 | 1.62x | draftsmith's evaluator loop | cpu |",
        "| gsm8k.jsonl | 0.7 | off | no depth pays (best 2: 0.81x) | draftsmith's evaluator loop | NVIDIA H100 |",
    ]
    assert recommendation_table([REPORT, tree]) == []  # reports from before the recommendation, a tree run
    card = render_card("acme/eagle3-tiny", SOURCE, [pays], EXPORTS, "apache-2.0")
    assert (
        "| mt_bench.jsonl | 0.0 | 0.610 | 0.420 | 0.300 |\n\nThe draft depth to serve (vLLM's "
        "`num_speculative_tokens`; the vLLM export uses the first report's, unless vLLM's own measurement "
        "below timed several depths)" in card
    )
    assert (
        "|---|---|---|---|---|---|\n| mt_bench.jsonl | 0.0 | 2 | 1.62x | draftsmith's evaluator loop | cpu |\n\n"
        "Versions and device:" in card
    )


def test_several_serve_commands_read_as_alternatives():
    """An export with two ways to serve it (the speculators directory alone, or the target naming it) lists
    them with "# or:" between, not as two steps of one recipe."""
    exports = {
        "vllm": {**EXPORTS["vllm"], "serve": ["vllm serve {dir}", "vllm serve T --speculative-config X"]}
    }
    card = render_card("acme/eagle3-tiny", SOURCE, [REPORT], exports, "apache-2.0")
    block = card.split("**vllm** (eagle3-vllm-speculators):")[1].split("```")[1].splitlines()
    assert block == [
        "bash",
        "hf download acme/eagle3-tiny --include 'engines/vllm/*' --local-dir drafter",
        "vllm serve drafter/engines/vllm",
        "# or:",
        "vllm serve T --speculative-config X",
    ]


def test_a_data_set_is_named_by_its_file_and_the_folder_holding_it(tmp_path):
    """Three sets whose files are named test.jsonl, question.jsonl, HumanEval.jsonl.gz read as what they are; a
    file in the home or temporary directory (or at the root) is named alone, so no user name reaches the Hub."""
    assert data_label("/srv/data/gsm8k/test.jsonl") == "gsm8k/test.jsonl"
    assert data_label("../shared/data/mt_bench/question.jsonl") == "mt_bench/question.jsonl"
    assert data_label("humaneval/HumanEval.jsonl.gz") == "humaneval/HumanEval.jsonl.gz"
    assert data_label("gsm8k.jsonl") == "gsm8k.jsonl"
    assert data_label(str(Path.home() / "prompts.jsonl")) == "prompts.jsonl"
    assert data_label("~/prompts.jsonl") == "prompts.jsonl"
    assert data_label(str(Path(tempfile.gettempdir()) / "p.jsonl")) == "p.jsonl"
    assert data_label("/p.jsonl") == "p.jsonl"
    assert data_label(None) is None and data_label("-") == "-"
    gsm8k: dict = copy.deepcopy(REPORT)
    gsm8k["settings"]["data"] = "/srv/data/gsm8k/test.jsonl"
    card = render_card("acme/eagle3-tiny", SOURCE, [gsm8k], EXPORTS, "apache-2.0")
    assert "| gsm8k/test.jsonl | 20 | 0.0 | 1.00 | 3 | chain | 0 | **1.734** |" in card
    assert "/srv/data" not in card
