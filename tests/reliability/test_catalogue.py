"""The fault catalogue, part 1: bad inputs and faults driven through the `draftsmith` command line, each
asserting a non-zero exit, exactly one `error:` line and no traceback, and that nothing that existed before
was changed (every file under the case's directory hashed before and after). Kill/resume, lock and damaged
checkpoint cases that need a training run are in tests/recipes/test_run_safety.py.

Cases run in-process through `draftsmith.scripts.cli.main`, the function the `draftsmith` console script
calls, so an exception that escaped would fail the case as a traceback. Recipe and option mistakes are
argparse usage errors (`PROG: error: ...`, status 2); everything else is `error: ...`, status 1."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from eval_report import of  # tests/unit/ship/, on the path
from fault_catalogue import check_one_line, run_case

from draftsmith.models.checkpoint import save_drafter
from draftsmith.models.eagle import EagleConfig
from draftsmith.models.eagle3 import Eagle3Draft, build_vocab_map
from draftsmith.models.medusa import MedusaConfig, MedusaHeads
from draftsmith.scripts.cli import main as cli


@dataclass
class World:
    """What the cases work on, laid out under one directory (hashed before and after each case)."""

    root: Path
    target: Path  # the tiny toy target
    drafter: Path  # a measured EAGLE-3 drafter (final/ with eval.json)
    medusa: Path  # a Medusa drafter
    data: Path  # a good prompts file


@pytest.fixture(scope="module")
def world(tiny_toy_target, tmp_path_factory) -> World:
    from draftsmith.models.target import FrozenTarget, TargetConfig

    root = tmp_path_factory.mktemp("catalogue")
    target = FrozenTarget.load(TargetConfig(path=str(tiny_toy_target)))
    draft = Eagle3Draft(EagleConfig(version=3, draft_vocab_size=64, ttt_steps=2), target.model.config, 64)
    draft.set_vocab_map(*build_vocab_map(torch.arange(target.vocab_size).flip(0), 64))
    drafter = save_drafter(root / "run" / "final", draft, target.identity())
    (drafter / "eval.json").write_text(
        json.dumps(of(drafter, {"tau": 1.5, "num_prompts": 1, "settings": {}}))
    )
    heads = MedusaHeads(MedusaConfig(num_heads=2), target.hidden_size, target.vocab_size)
    medusa = save_drafter(root / "medusa" / "final", heads, target.identity())
    data = root / "prompts.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Say hello."}]}) + "\n")
    return World(root, Path(tiny_toy_target), drafter, medusa, data)


def _eval_ngram(w: World) -> list[str]:
    return ["eval", "--target", str(w.target), "--drafter", "ngram", "--data", str(w.data)]


def _copy(src: Path, dst: Path, edit: Callable[[Path], object]) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def _flip_last_byte(d: Path) -> None:
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-1] ^= 0x10
    (d / "model.safetensors").write_bytes(bytes(data))


def _truncate(name: str, keep: int) -> Callable[[Path], object]:
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[:keep])


# id -> (setup(world) -> argv, the text the one error line must hold)
CASES: dict[str, tuple[Callable[[World], list[str]], str]] = {
    # ---- data and recipe --------------------------------------------------------------------------------
    "train-unknown-key": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.lrr=1e-3",
        ],
        "did you mean 'train.lr'",
    ),
    "train-max-steps-0": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.max_steps=0",
        ],
        "train.max_steps must be >= 1",
    ),
    "train-lr-negative": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.lr=-1",
        ],
        "train.lr must be > 0",
    ),
    "train-missing-data": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.train=[{w.root}/nope.jsonl]",
            f"output_dir={w.root}/out-missing-data",
        ],
        "nope.jsonl",
    ),
    "train-missing-config": (lambda w: ["train", "medusa", "--config", f"{w.root}/nope.yaml"], "nope.yaml"),
    "train-resume-missing-checkpoint": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"--resume={w.root}/no-ckpt",
            f"output_dir={w.root}/out-resume",
        ],
        "not a complete checkpoint",
    ),
    # ---- targets ----------------------------------------------------------------------------------------
    "eval-missing-target": (
        lambda w: ["eval", "--target", f"{w.root}/no-target", "--drafter", "ngram", "--data", str(w.data)],
        "no-target",
    ),
    # ---- evaluator settings -----------------------------------------------------------------------------
    "eval-report-is-a-directory": (
        lambda w: [*_eval_ngram(w), "--report", str(w.root)],
        "is a directory; name the file to write",
    ),
    "eval-plot-under-a-file": (
        lambda w: [*_eval_ngram(w), "--plot", str(w.data / "acceptance.png")],
        "prompts.jsonl is a file, not a directory",
    ),
    "eval-depth-huge": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--depth",
            "100000",
        ],
        "--depth must be in 0..64",
    ),
    "eval-tree-huge": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--tree",
            "topk:5000",
            "--depth",
            "4",
        ],
        "at most 1024",
    ),
    "eval-max-new-tokens-huge": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--max-new-tokens",
            "100000000",
        ],
        "--max-new-tokens must be",
    ),
    "eval-unknown-tree": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--tree",
            "beam:2",
        ],
        "chain, topk:K",
    ),
    "eval-missing-data": (
        lambda w: ["eval", "--target", str(w.target), "--drafter", "ngram", "--data", f"{w.root}/nope.jsonl"],
        "nope.jsonl",
    ),
    "eval-lossless-at-t1": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--temperature",
            "1",
            "--check-lossless",
        ],
        "greedy",
    ),
    # ---- weights and checkpoints ------------------------------------------------------------------------
    "eval-flipped-byte": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--data",
            str(w.data),
            "--drafter",
            str(_copy(w.drafter, w.root / "flipped", _flip_last_byte)),
        ],
        "sha256",
    ),
    "eval-truncated-config": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--data",
            str(w.data),
            "--drafter",
            str(_copy(w.drafter, w.root / "badjson", _truncate("config.json", 50))),
        ],
        "not valid JSON",
    ),
    "eval-training-checkpoint": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--data",
            str(w.data),
            "--drafter",
            str(
                _copy(
                    w.drafter,
                    w.root / "run" / "checkpoint-4",
                    lambda d: (d / "trainer_state.json").write_text("{}"),
                )
            ),
        ],
        "is a training checkpoint",
    ),
    "export-flipped-byte": (
        lambda w: [
            "export",
            str(_copy(w.drafter, w.root / "flipped2", _flip_last_byte)),
            "--to",
            "vllm",
            "--out",
            f"{w.root}/exp1",
        ],
        "sha256",
    ),
    "export-weights-of-another-drafter": (
        lambda w: [
            "export",
            str(
                _copy(
                    w.drafter,
                    w.root / "swapped",
                    lambda d: shutil.copy(w.medusa / "model.safetensors", d / "model.safetensors"),
                )
            ),
            "--to",
            "vllm",
            "--out",
            f"{w.root}/exp2",
        ],
        "sha256",
    ),
    "export-unserved-engine": (
        lambda w: ["export", str(w.drafter), "--to", "tgi", "--out", f"{w.root}/exp3"],
        "tgi does not serve eagle3",
    ),
    "export-not-a-checkpoint": (
        lambda w: ["export", str(w.root), "--to", "vllm", "--out", f"{w.root}/exp4"],
        "config.json is missing",
    ),
    # ---- uploads ----------------------------------------------------------------------------------------
    "push-local-target-without-repo": (
        lambda w: ["push", str(w.drafter), "--repo", "acme/x", "--dry-run", f"{w.root}/up1"],
        "--target-repo",
    ),
    "push-bad-repo-id": (
        lambda w: ["push", str(w.drafter), "--repo", "not a repo", "--dry-run", f"{w.root}/up2"],
        "expected ORG/NAME",
    ),
    "push-unmeasured": (
        lambda w: [
            "push",
            str(w.medusa),
            "--repo",
            "acme/x",
            "--target-repo",
            "acme/t",
            "--dry-run",
            f"{w.root}/up3",
        ],
        "measure the drafter first",
    ),
    # ---- more recipe numbers ----------------------------------------------------------------------------
    "train-epochs-0": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.epochs=0",
        ],
        "train.epochs must be > 0",
    ),
    "train-max-grad-norm-0": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.max_grad_norm=0",
        ],
        "max_grad_norm must be > 0",
    ),
    "train-warmup-ratio-1": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            "train.warmup_ratio=1",
        ],
        "warmup_ratio must be in [0, 1)",
    ),
    "cache-without-directory": (
        lambda w: ["cache", "medusa", "--config", "recipes/medusa/tiny.yaml", f"target.path={w.target}"],
        "set data.cache=DIR",
    ),
    # ---- run directories ----------------------------------------------------------------------------------
    "train-over-a-finished-run": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"output_dir={_old_run(w)}",
        ],
        "pass --resume",
    ),
    "train-into-a-busy-directory": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"output_dir={_busy_dir(w)}",
        ],
        "in use by training, pid",
    ),
    # ---- more evaluator settings --------------------------------------------------------------------------
    "eval-num-prompts-negative": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--num-prompts",
            "-1",
        ],
        "--num-prompts must be >= 0",
    ),
    "eval-depth-negative": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--depth",
            "-1",
        ],
        "--depth must be in 0..64",
    ),
    "eval-paths-file-missing": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--tree",
            f"paths:{w.root}/nope.json",
        ],
        "does not exist",
    ),
    "eval-dynamic-tree-zero": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--tree",
            "dynamic:0:5",
        ],
        "dynamic:K:N",
    ),
    "eval-unknown-dtype": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--drafter",
            "ngram",
            "--data",
            str(w.data),
            "--dtype",
            "float8",
        ],
        "invalid choice",
    ),
    "eval-tokenizer-larger-than-model": (
        lambda w: ["eval", "--target", str(_grown_tokenizer(w)), "--drafter", "ngram", "--data", str(w.data)],
        "tokenizer has",
    ),
    # ---- more weights and exports -------------------------------------------------------------------------
    "eval-truncated-weights": (
        lambda w: [
            "eval",
            "--target",
            str(w.target),
            "--data",
            str(w.data),
            "--drafter",
            str(_copy(w.drafter, w.root / "trunc", _truncate("model.safetensors", 64))),
        ],
        "sha256",
    ),
    "export-truncated-weights-without-a-hash": (
        lambda w: [
            "export",
            str(_copy(w.drafter, w.root / "trunc2", _unhashed_truncation)),
            "--to",
            "vllm",
            "--out",
            f"{w.root}/exp5",
        ],
        "not a readable safetensors file",
    ),
    "export-unknown-engine": (
        lambda w: ["export", str(w.drafter), "--to", "trt", "--out", f"{w.root}/exp6"],
        "invalid choice",
    ),
    "export-over-a-foreign-directory": (
        lambda w: ["export", str(w.drafter), "--to", "vllm", "--out", str(_foreign_dir(w))],
        "is not a draftsmith export",
    ),
    "export-to-a-fine-tune-of-the-target": (
        lambda w: [
            "export",
            str(w.drafter),
            "--to",
            "vllm",
            "--out",
            f"{w.root}/exp7",
            "--target",
            str(_fine_tune(w)),
        ],
        "weights_sha256",
    ),
    # ---- offline feature caches ------------------------------------------------------------------------------
    "train-on-a-corrupt-cache": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.cache={_corrupt_cache(w)}",
            f"output_dir={w.root.parent}/out-corrupt-cache",
        ],
        "is corrupt",
    ),
    "train-on-a-corrupt-cache-unverified": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.cache={_corrupt_cache(w)}",
            "data.cache_verify=false",
            "train.max_steps=4",
            f"output_dir={w.root.parent}/out-corrupt-cache-unverified",
        ],
        "is corrupt",
    ),
    "train-on-a-truncated-cache": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.cache={_truncated_cache(w)}",
            f"output_dir={w.root.parent}/out-truncated-cache",
        ],
        "is truncated",
    ),
    "train-on-a-cache-of-another-target": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={_fine_tune(w)}",
            f"data.cache={_cache(w)}",
            f"output_dir={w.root.parent}/out-other-cache",
        ],
        "weights_sha256",
    ),
}

CACHE_DATA = ["data.max_samples=16", "data.eval_max_samples=4", "data.max_len=128"]


def _cache(w: World) -> Path:
    """A Medusa feature cache of the tiny target, built once (several train shards)."""
    out = w.root / "cache"
    if not (out / "index.json").is_file():
        code = cli(
            [
                "cache",
                "medusa",
                "--config",
                "recipes/medusa/tiny.yaml",
                f"target.path={w.target}",
                f"data.cache={out}",
                "--shard-tokens",
                "300",
                *CACHE_DATA,
            ]
        )
        assert code == 0
    return out


def _damaged_cache(w: World, name: str, damage: Callable[[bytearray], bytes]) -> Path:
    out = w.root / name
    if not out.exists():
        shutil.copytree(_cache(w), out)
        shards = sorted(out.glob("train-*.safetensors"))
        assert len(shards) >= 2
        for shard in shards:  # every train shard: whichever the first step reads is damaged
            shard.write_bytes(damage(bytearray(shard.read_bytes())))
    return out


def _flip_middle(data: bytearray) -> bytes:
    data[len(data) // 2] ^= 0xFF  # same size: only the sha256 can tell
    return bytes(data)


def _corrupt_cache(w: World) -> Path:
    return _damaged_cache(w, "cache-corrupt", _flip_middle)


def _truncated_cache(w: World) -> Path:
    return _damaged_cache(w, "cache-truncated", lambda data: bytes(data[:-100]))


def _old_run(w: World) -> Path:
    run = w.root / "old-run"
    (run / "checkpoint-2").mkdir(parents=True, exist_ok=True)
    (run / "checkpoint-2" / "trainer_state.json").write_text("{}")
    return run


def _busy_dir(w: World) -> Path:
    import socket

    busy = w.root / "busy-run"
    busy.mkdir(exist_ok=True)
    (busy / ".draftsmith.lock").write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "purpose": "training"})
    )
    return busy


def _grown_tokenizer(w: World) -> Path:
    from transformers import AutoTokenizer

    out = w.root / "grown-target"
    if not out.exists():
        shutil.copytree(w.target, out)
        tok = AutoTokenizer.from_pretrained(out)
        tok.add_tokens([f"<extra_{i}>" for i in range(64)])
        tok.save_pretrained(out)
    return out


def _unhashed_truncation(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    config.pop("weights_sha256")
    (d / "config.json").write_text(json.dumps(config))
    _truncate("model.safetensors", 64)(d)


def _foreign_dir(w: World) -> Path:
    out = w.root / "my-notes"
    out.mkdir(exist_ok=True)
    (out / "notes.txt").write_text("not an export")
    return out


def _fine_tune(w: World) -> Path:
    from transformers import AutoModelForCausalLM

    out = w.root / "fine-tune"
    if not out.exists():
        shutil.copytree(w.target, out)
        model = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(1.01)
        model.save_pretrained(out)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_fault_is_one_clear_line_and_changes_nothing(case, world, capsys, monkeypatch):
    monkeypatch.chdir(
        Path(__file__).resolve().parents[2]
    )  # recipes/ paths as a user in a checkout types them
    setup, expected = CASES[case]
    argv = setup(world)  # builds the damaged copies first: they are part of "before"
    code, err, unchanged = run_case(argv, capsys, world.root)
    check_one_line(case, code, err, expected, unchanged)
