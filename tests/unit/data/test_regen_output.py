"""The output contract `data regenerate` shares between its local and endpoint paths (data/regen_output.py), and
its typed settings: resume reads what OUT holds, a half-written line is cut, other settings are refused, the
meta file is JSON written whole; every flag is a field, and the run lines in `--help` parse."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from draftsmith.data.formats import Conversation
from draftsmith.data.regen_output import RegenOutput, Sampling, new_counts, read_done, run_meta
from draftsmith.scripts.data import regenerate
from draftsmith.scripts.data.regenerate_settings import RegenerateArgs

SAMPLING = Sampling(temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=16, seed=0)


def meta(**sampling) -> dict:
    return run_meta(
        Sampling(**{**vars(SAMPLING), **sampling}), {"served_model": "m"}, "in.jsonl", "auto", dtype="x"
    )


def test_resume_reads_both_files_and_cuts_a_half_written_line(tmp_path):
    out = tmp_path / "sub" / "out.jsonl"
    output = RegenOutput(out, meta())
    assert output.resume() == set()  # a new run: the directory is made, the settings written first
    assert json.loads(output.meta_path.read_text()) == meta()
    conv = Conversation(messages=[{"role": "user", "content": "é"}], source="in.jsonl:1", category="writing")
    with output.appending() as writer:
        writer.row(0, conv, [{"role": "assistant", "content": "é"}])
        writer.failure(1, conv, "why")
    rows = out.read_text()
    assert (
        rows == '{"index": 0, "messages": [{"role": "assistant", "content": "é"}], "category": "writing"}\n'
    )
    out.write_text(rows + '{"index": 2, "mess')  # a run killed while writing
    assert RegenOutput(out, meta()).resume() == {0, 1}
    assert out.read_text() == rows
    assert json.loads(output.failed_path.read_text()) == {"index": 1, "source": "in.jsonl:1", "reason": "why"}


def test_resume_with_other_sampling_is_refused_and_the_outcome_follows_the_settings(tmp_path):
    out = tmp_path / "out.jsonl"
    output = RegenOutput(out, meta())
    output.resume()
    output.finish(counts=new_counts(3, 2, ("answers",)), tool_choice="auto")
    text = output.meta_path.read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    assert list(json.loads(text)) == ["sampling", "target", "data", "dtype", "counts", "tool_choice"]
    assert json.loads(text)["counts"] == {"input": 3, "written": 0, "failed": 0, "skipped": 1, "answers": 0}
    with pytest.raises(ValueError, match="was written with sampling .* resume with the same settings"):
        RegenOutput(out, meta(seed=1)).resume()


def test_a_file_that_is_not_regenerate_output_is_named(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"index": 0}\n{"messages": []}\n')
    with pytest.raises(ValueError, match=r"out.jsonl:2 is not a regenerate row"):
        read_done(out)


def test_every_flag_is_a_setting_and_the_help_run_lines_run():
    parser = regenerate.build_parser()
    assert [a.dest for a in parser._actions if a.dest != "help"] == [f.name for f in fields(RegenerateArgs)]
    settings = regenerate.parse_args(["--target", "DIR", "--data", "SRC", "--out", "o.jsonl"])
    assert settings.out == Path("o.jsonl") and settings.sampling == Sampling(0.8, 0.95, 0, 256, 0)
    runs = [line.split() for line in (regenerate.__doc__ or "").splitlines() if line.startswith("    ")]
    assert [run[:3] for run in runs] == [
        ["draftsmith", "data", "regenerate"],
        ["python", "-m", "draftsmith.scripts.data.regenerate"],
    ]
    regenerate.parse_args([w.strip("[]") for w in runs[0][3:] if w != "..."])  # its flags are real
    ran = subprocess.run(
        [sys.executable, *runs[1][1:3], "--help"], capture_output=True, text=True, check=True
    )
    assert ran.stdout.startswith("usage: draftsmith data regenerate")
