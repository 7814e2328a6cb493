"""`draftsmith eval` end to end on the tiny toy target: report, plot, gate, checkpoint eval.json, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from draftsmith.data.conversations import with_answers
from draftsmith.eval.acceptance import main
from draftsmith.eval.depth import Calibration, expected_speedups, recommend, verdict
from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.target import FrozenTarget, TargetConfig

REPO = Path(__file__).resolve().parents[3]
REPORT_KEYS = {
    "tau",
    "alpha",
    "acceptance_by_depth",
    "target_forwards",
    "new_tokens",
    "num_prompts",
    "per_prompt",
    "wall_time_s",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    "lossless",
    "settings",
    "draft_cost_s",
    "verify_cost_s",
    "cost_calibration",
    "expected_speedup_by_depth",
    "recommended_depth",
    "recommended_speedup",
}


@pytest.fixture(scope="module")
def medusa_ckpt(tiny_toy_target, tmp_path_factory):
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(num_heads=2), target.hidden_size, target.vocab_size)
    heads.init_from_lm_head(target.lm_head.weight)
    return save_drafter(tmp_path_factory.mktemp("medusa") / "final", heads, target.identity())


def run_eval(tiny_toy_target, *args: str) -> int:
    return main(["--target", str(tiny_toy_target), "--no-progress", "--max-new-tokens", "16", *args])


def test_mt_bench_two_turns_report_plot_and_lossless_check(tiny_toy_target, shared_data, tmp_path, capsys):
    report_path, plot = tmp_path / "r.json", tmp_path / "r.png"
    code = run_eval(
        tiny_toy_target,
        "--drafter",
        "ngram",
        "--data",
        str(shared_data / "mt_bench" / "question.jsonl"),
        "--num-prompts",
        "2",
        "--check-lossless",
        "--report",
        str(report_path),
        "--plot",
        str(plot),
    )
    assert code == 0
    report = json.loads(report_path.read_text())
    assert set(report) >= REPORT_KEYS
    assert report["num_prompts"] == 2 and report["num_turns"] == 4  # MT-bench items have two turns
    assert [(r["id"], r["turn"]) for r in report["per_prompt"]] == [
        ("81", 0),
        ("81", 1),
        ("82", 0),
        ("82", 1),
    ]
    assert report["lossless"] is True and all(r["matches_greedy"] for r in report["per_prompt"])
    assert report["target_forwards"] == report["verification_forwards"] + 4
    assert report["settings"]["seed"] == 0 and report["settings"]["versions"]["torch"] == torch.__version__
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "| tau (tokens per verification forward, pooled: vLLM's and SGLang's) |" in out
    # MT-bench's `category`: both items are "writing", so that row is the whole report's pooled tau
    assert set(report["by_category"]) == {"writing"} and report["by_category"]["writing"]["answers"] == 4
    assert report["by_category"]["writing"]["tau"] == pytest.approx(report["tau"])
    assert "| category | answers | tau (pooled) | tau (mean per answer) |" in out
    # The depth prediction is recomputed from the JSON alone: the profile times 1..depth + 1 tokens.
    depth = report["settings"]["depth"]
    assert len(report["verify_cost_s"]) == depth + 1 and all(c > 0 for c in report["verify_cost_s"])
    calibration = Calibration(**report["cost_calibration"])
    assert calibration.verify_scale > 0 and calibration.plain_cost_s == pytest.approx(
        1 / report["baseline_tokens_per_s"]
    )
    speedups = expected_speedups(
        report["acceptance_by_depth"], report["draft_cost_s"], report["verify_cost_s"], calibration
    )
    assert report["expected_speedup_by_depth"] == pytest.approx(speedups) and speedups
    assert (report["recommended_depth"], report["recommended_speedup"]) == pytest.approx(recommend(speedups))
    assert f"| recommended depth (whose costs) | {verdict(report)} |" in out


def test_second_turn_is_conditioned_on_the_models_own_first_answer():
    prompt = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "user", "content": "q2"},
    ]
    assert with_answers(prompt, ["a1"]) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]


def test_gate_fails_with_status_3_and_checkpoint_gets_eval_json(tiny_toy_target, medusa_ckpt, capsys):
    code = run_eval(
        tiny_toy_target,
        "--drafter",
        str(medusa_ckpt),
        "--data",
        "stdlib:heldout",
        "--num-prompts",
        "2",
        "--tree",
        "topk:2",
        "--save-eval",
        "--min-tau",
        "100",
        "--no-baseline",
    )
    assert code == 3
    assert "gate failed: tau" in capsys.readouterr().err
    saved = json.loads((medusa_ckpt / "eval.json").read_text())
    assert saved["settings"]["tree"] == "topk:2" and saved["speedup"] is None
    assert saved["recommended_depth"] is None and saved["verify_cost_s"] is None  # chains only
    assert (
        run_eval(
            tiny_toy_target,
            "--drafter",
            str(medusa_ckpt),
            "--data",
            "stdlib:heldout",
            "--num-prompts",
            "1",
            "--min-tau",
            "1.0",
            "--no-baseline",
        )
        == 0
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drafter", "/no/such/dir", "--data", "stdlib:heldout"], "is not a directory"),
        (["--drafter", "ngram", "--data", "/no/such.jsonl"], "does not exist"),
        (
            ["--drafter", "ngram", "--data", "stdlib:heldout", "--temperature", "1", "--check-lossless"],
            "greedy",
        ),
        (["--drafter", "ngram", "--data", "stdlib:heldout", "--tree", "beam:2"], "chain, topk:K"),
        (["--drafter", "ngram", "--data", "stdlib:heldout", "--depth", "100000"], "--depth must be in 0..64"),
        (
            ["--drafter", "ngram", "--data", "stdlib:heldout", "--max-new-tokens", "10000000"],
            "--max-new-tokens must be in 1..",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(tiny_toy_target, args, message, capsys):
    assert run_eval(tiny_toy_target, *args) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0]


def test_medusa_depth_beyond_its_heads_and_foreign_tokenizer_are_refused(
    tiny_toy_target, medusa_ckpt, toy_tokenizer, tmp_path, capsys
):
    assert (
        run_eval(tiny_toy_target, "--drafter", str(medusa_ckpt), "--data", "stdlib:heldout", "--depth", "4")
        == 1
    )
    assert "lower --depth to 2" in capsys.readouterr().err
    from conftest import make_tiny_llama

    make_tiny_llama(len(toy_tokenizer)).save_pretrained(tmp_path / "draft")
    toy_tokenizer.save_pretrained(tmp_path / "draft")
    assert run_eval(tiny_toy_target, "--drafter", str(tmp_path / "draft"), "--data", "stdlib:heldout") == 1
    assert "different tokenizer" in capsys.readouterr().err


def test_script_entry_point_runs_from_a_checkout():
    out = subprocess.run(
        [sys.executable, "-m", "draftsmith.eval.acceptance", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--min-tau" in out.stdout and "deployment gate" in out.stdout


def test_the_evaluator_reads_a_config_file_overrides_and_flags_through_one_strict_loader(tmp_path, capsys):
    from typing import get_args, get_type_hints

    from draftsmith.eval.acceptance import build_parser, parse
    from draftsmith.eval.kv_cache import KV_CACHES
    from draftsmith.eval.settings import EvalArgs

    config = tmp_path / "eval.yaml"
    config.write_text("target: t\ndrafter: ngram\ndata: d.jsonl\ndepth: 3\ntree: topk:2\n")
    args = parse(["--config", str(config), "depth=4", "temperature=1", "--top-k", "5", "--no-baseline"])
    assert (args.target, args.depth, args.tree, args.temperature, args.top_k, args.baseline) == (
        "t",
        4,
        "topk:2",
        1.0,
        5,
        False,
    )
    assert parse(["--config", str(config), "--depth", "2", "depth=6"]).depth == 2  # the flag wins
    flags = parse(["--target", "t", "--drafter", "ngram", "--data", "x: y.jsonl", "--tree", "dynamic:4:16"])
    assert (flags.data, flags.tree, flags.depth) == ("x: y.jsonl", "dynamic:4:16", None)  # text stays text
    assert get_args(get_type_hints(EvalArgs)["kv_cache"]) == KV_CACHES
    help_text = " ".join(build_parser().format_help().split())
    assert "num_prompts (int, default 20)" in help_text
    # a switch that turns a default-on field off says so, instead of repeating what the field turns on
    assert "--no-baseline Turn off (on by default): also run plain decoding" in help_text
    for argv, message in (
        (["--config", str(config), "depht=3"], "did you mean 'depth'"),
        (["--drafter", "ngram", "--data", "d"], "missing required key 'target'"),
        (["--config", str(config), "--depth", "four"], "depth: expected"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parse(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "draftsmith eval: error: " in err and message in err, err


def test_draft_sample_method_sets_the_protocol_of_a_chain(tiny_toy_target):
    """The target drafting for itself at T=1: sampled drafts (q = p) are always accepted, min(1, p/q) = 1, so
    every draft token is accepted; greedy drafts are accepted with p(argmax) < 1, so some are not."""
    from draftsmith.eval.acceptance import EvalArgs, evaluate

    common: dict[str, Any] = dict(target=str(tiny_toy_target), drafter="self", data="stdlib:heldout")
    common |= dict(num_prompts=1, max_new_tokens=16, depth=3, temperature=1.0, baseline=False, progress=False)
    sampled = evaluate(EvalArgs(**common, draft_sample_method="probabilistic"))
    greedy = evaluate(EvalArgs(**common, draft_sample_method="greedy"))
    assert sampled["alpha"] == pytest.approx(1.0) and greedy["alpha"] < 0.95
    assert sampled["settings"]["draft_sample_method"] == "probabilistic"
    with pytest.raises(ValueError, match="applies to chains"):
        evaluate(EvalArgs(**common | {"tree": "topk:2"}, draft_sample_method="greedy"))
