"""The output contract `data regenerate` shares between its local and endpoint paths (data/regen_output.py), and
its typed settings: resume reads what OUT holds, a half-written line is cut (only in a regenerate output), other
settings, another model or other data content are refused in one line saying which, failures are retried on
request, the meta file is JSON written whole and keeps every run; every flag is a field, and the run lines in
`--help` parse."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from draftsmith.data.formats import Conversation
from draftsmith.data.regen_output import (
    RegenOutput,
    Sampling,
    content_sha256,
    data_record,
    new_counts,
    read_done,
    run_meta,
)
from draftsmith.runtime.errors import UserError
from draftsmith.scripts.data import regenerate
from draftsmith.scripts.data.regenerate_settings import RegenerateArgs

SAMPLING = Sampling(temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=16, seed=0)
CONVS = [
    Conversation(messages=[{"role": "user", "content": f"q{i}"}], source=f"in.jsonl:{i}") for i in range(4)
]


def meta(convs=CONVS, target=None, **sampling) -> dict:
    return run_meta(
        Sampling(**{**vars(SAMPLING), **sampling}),
        target or {"served_model": "m", "root": "/w/a"},
        data_record("in.jsonl", "auto", convs),
        dtype="x",
    )


def output(out, convs=CONVS, **kw) -> RegenOutput:
    return RegenOutput(out, meta(convs, **kw), convs)


def test_resume_reads_both_files_and_cuts_a_half_written_line(tmp_path):
    out = tmp_path / "sub" / "out.jsonl"
    first = output(out)
    assert first.resume() == set()  # a new run: the directory is made, the settings written first
    assert json.loads(first.meta_path.read_text()) == meta()
    conv = Conversation(messages=[{"role": "user", "content": "é"}], source="in.jsonl:1", category="writing")
    with first.appending() as writer:
        writer.row(0, conv, [{"role": "assistant", "content": "é"}])
        writer.failure(1, conv, "why")
    rows = out.read_text()
    assert (
        rows == '{"index": 0, "messages": [{"role": "assistant", "content": "é"}], "category": "writing"}\n'
    )
    out.write_text(rows + '{"index": 2, "mess')  # a run killed while writing
    assert output(out).resume() == {0, 1}
    assert out.read_text() == rows
    assert json.loads(first.failed_path.read_text()) == {"index": 1, "source": "in.jsonl:1", "reason": "why"}
    retry = output(out)
    assert retry.resume(retry_failed=True) == {0}  # conversation 1 is asked again, its record cleared
    assert retry.failed_path.read_text() == "" and retry.rows_before == 1


def test_resume_with_other_sampling_is_refused_and_the_outcome_follows_the_settings(tmp_path):
    out = tmp_path / "out.jsonl"
    first = output(out)
    first.resume()
    first.finish(counts=new_counts(3, 2, ("answers",)), tool_choice="auto")
    text = first.meta_path.read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    assert list(json.loads(text)) == [
        *("written_by", "sampling", "target", "data", "dtype", "counts", "tool_choice", "runs")
    ]
    assert json.loads(text)["counts"] == {"input": 3, "written": 0, "failed": 0, "skipped": 1, "answers": 0}
    with pytest.raises(UserError, match=r"other settings: the sampling differs \(seed 0 -> 1\)"):
        output(out, seed=1).resume()
    assert first.meta_path.read_text() == text  # refused before anything was written
    second = output(out)
    second.resume()
    second.finish(counts={"input": 4})
    assert [r["counts"] for r in json.loads(first.meta_path.read_text())["runs"]] == [
        json.loads(text)["counts"],
        {"input": 4},
    ]


def test_another_model_behind_the_same_name_is_refused_naming_what_changed(tmp_path):
    out = tmp_path / "out.jsonl"
    output(out).resume()
    moved = {"served_model": "m", "root": "/w/b"}
    with pytest.raises(UserError, match=r"the served model differs \(root '/w/a' -> '/w/b'\)"):
        output(out, target=moved).resume()


def test_new_content_at_the_same_path_is_refused_and_more_of_the_same_data_resumes(tmp_path):
    out = tmp_path / "out.jsonl"
    output(out, CONVS[:2]).resume()
    edited = [Conversation(messages=[{"role": "user", "content": "other"}])] + CONVS[1:]
    with pytest.raises(UserError, match=r"the data's content changed: its first 2 conversations"):
        output(out, edited).resume()
    assert content_sha256(CONVS[:2]) != content_sha256(edited[:2])
    assert output(out, CONVS).resume() == set()  # --max-samples raised: the first two hash as before
    with pytest.raises(UserError, match=r"the data has 1 conversations but this output was started with 4"):
        output(out, CONVS[:1]).resume()
    # where it was read from is not content: the same conversations from another file resume
    moved = [Conversation(messages=c.messages, source=f"other.jsonl:{k}") for k, c in enumerate(CONVS)]
    assert content_sha256(moved) == content_sha256(CONVS)


def test_a_file_that_is_not_regenerate_output_is_named_and_left_alone(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"index": 0}\n{"messages": []}')  # no trailing newline: the last line looks half-written
    before = out.read_bytes()
    with pytest.raises(
        UserError, match=r"out.jsonl exists and is not a regenerate output \(no out.jsonl.meta"
    ):
        output(out).check("in.jsonl")
    with pytest.raises(UserError, match=r"bad.jsonl:1 is not a regenerate row"):
        (tmp_path / "bad.jsonl").write_text('{"messages": []}\n{"index": 1')
        read_done(tmp_path / "bad.jsonl")
    assert out.read_bytes() == before
    with pytest.raises(UserError, match="is the input --data file"):
        output(out).check(str(out))
    with pytest.raises(UserError, match="is a directory; name the .jsonl file"):
        output(tmp_path).check("in.jsonl")


@pytest.mark.parametrize(
    ("text", "why"), [("", "it is empty"), ("[1]", "no sampling, target, data"), ("{", "not valid JSON")]
)
def test_a_damaged_meta_file_is_one_line(tmp_path, text, why):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    (tmp_path / "out.jsonl.meta.json").write_text(text)
    with pytest.raises(UserError, match=f"out.jsonl.meta.json is not a regenerate meta file \\({why}"):
        output(out).check("in.jsonl")


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
