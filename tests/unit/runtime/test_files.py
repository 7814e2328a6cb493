"""runtime/files.py's atomic writer: the file appears whole or not at all, the JSON pair round-trips, and a
failed write leaves the previous file and no temporary behind."""

from __future__ import annotations

import json
import stat

import pytest

from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import DamagedFile, atomic_file, read_json, write_json, write_text


def test_write_json_round_trips_and_writes_the_documented_bytes(tmp_path):
    path = tmp_path / "new" / "dir" / "report.json"  # missing parents are created
    data = {"b": 1, "a": [1.5, None, "ü"]}
    write_json(path, data)
    assert read_json(path) == data
    assert path.read_text() == json.dumps(data, indent=2) + "\n"  # the bytes every former copy wrote
    write_json(path, data, sort_keys=True, ensure_ascii=False)
    assert path.read_text() == '{\n  "a": [\n    1.5,\n    null,\n    "ü"\n  ],\n  "b": 1\n}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by all, not mkstemp's 0600
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    write_text(path, "old: 1\n")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_file(path) as tmp:
        tmp.write_text("new: half")
        raise RuntimeError("disk on fire")
    assert path.read_text() == "old: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_any_writer_can_fill_the_temporary(tmp_path):
    path = tmp_path / "rows.jsonl"
    with atomic_file(path) as tmp, tmp.open("w") as f:
        assert not path.exists()  # nothing is visible until the block ends
        f.write("1\n2\n")
    assert path.read_text() == "1\n2\n"


def test_read_json_names_the_place_where_a_file_is_broken(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text('{\n  "a": 1,\n  oops\n}\n')
    with pytest.raises(DamagedFile, match=r"meta.json:3:3: not valid JSON") as err:
        read_json(path)
    assert isinstance(err.value, UserError)
