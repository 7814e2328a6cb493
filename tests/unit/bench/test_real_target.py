"""The real-target benchmark's plan: which cells vLLM decodes, and the table read back from cell reports."""

import json
from pathlib import Path

from bench.real_target import EVAL_SETS, sample_method, table, vllm_cells


def test_core_vllm_cells_are_mt_bench_at_t0_and_the_flagship_and_baseline_beyond():
    cells = vllm_cells(["eagle3", "medusa", "mtp", "ngram"], "core", 8)
    want = {(n, "mt_bench", 0.0, 1) for n in ("eagle3", "medusa", "ngram")}  # MTP is not served: never asked
    want |= {(n, d, 0.0, 1) for n in ("eagle3", "ngram") for d in ("gsm8k", "humaneval")}
    want |= {(n, "mt_bench", 1.0, 1) for n in ("eagle3", "ngram")}
    want |= {(n, "mt_bench", 0.0, 8) for n in ("eagle3", "ngram")}
    assert set(cells) == want and len(cells) == len(want)
    assert vllm_cells(["eagle3", "ngram"], "none", 8) == []
    every = vllm_cells(["eagle3", "medusa", "mtp", "ngram"], "all", 8)
    assert len(every) == len(set(every)) == 3 * len(EVAL_SETS) * 2 + 2 * len(EVAL_SETS)


def test_sampled_drafts_only_at_t_above_zero_for_families_with_a_draft_distribution():
    assert (
        sample_method("eagle3", 1.0) == "probabilistic" and sample_method("draft_lm", 1.0) == "probabilistic"
    )
    assert sample_method("eagle3", 0.0) == "greedy" and sample_method("medusa", 1.0) == "greedy"
    assert sample_method("ngram", 1.0) == "greedy"


def _write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))


def test_the_table_reads_each_cell_and_marks_failures(tmp_path):
    r = {"tau": 1.5, "tau_stderr": 0.05, "alpha": 0.1, "acceptance_by_depth": [0.4, 0.1], "speedup": 0.8}
    _write(tmp_path / "eval" / "mt_bench-T0-chain-eagle3.json", r | {"lossless": True})
    _write(tmp_path / "eval" / "mt_bench-T0-topk3-eagle3.json", r | {"tau": 1.8, "lossless": False})
    _write(tmp_path / "eval" / "mt_bench-T0-chain-ngram.json", {"error": "ValueError: boom"})
    text = table(tmp_path, ["eagle3", "ngram"])
    rows = [line for line in text.splitlines() if line.startswith("| mt_bench")]
    assert (
        rows[0]
        == "| mt_bench | 0 | eagle3 | 1.500 ± 0.050 | 0.100 | 0.40 / 0.10 | 0.80 | 1.800 ± 0.050 | 0.80 | NO |"
    )
    assert rows[1].startswith("| mt_bench | 0 | ngram | error: ValueError: boom |")
    assert rows[1].count("|") == rows[0].count("|")
    assert rows[1].endswith("| - |")  # nothing decoded, so nothing was checked: neither yes nor NO
