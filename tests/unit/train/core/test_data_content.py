"""The data's content record (train/core/data_content.py): which sources are hashed and how, and what counts as
a change, each against an oracle computed here with hashlib."""

from __future__ import annotations

import hashlib

from draftsmith.train.core.data import DataConfig
from draftsmith.train.core.data_content import content_change, data_hashes, directory_sha256, source_hashes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_local_files_and_folders_are_hashed_built_ins_and_hub_names_are_not(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_bytes(b'{"text": "one"}\n')
    folder = tmp_path / "saved"
    (folder / "train").mkdir(parents=True)
    (folder / "state.json").write_bytes(b"{}")
    (folder / "train" / "data-00000.arrow").write_bytes(b"\x00\x01")
    sources = [str(a), str(folder), f"hf:{folder}:train", "stdlib:train", "prompts", "hf:owner/name"]
    sources.append(str(tmp_path / "missing.jsonl"))
    # the folder's oracle: each file's relative path and sha256, one line each, in path order
    lines = f"state.json\t{_sha(b'{}')}\ntrain/data-00000.arrow\t{_sha(bytes([0, 1]))}\n"
    assert source_hashes(sources) == {
        str(a): _sha(b'{"text": "one"}\n'),
        str(folder): _sha(lines.encode()),
        f"hf:{folder}:train": _sha(lines.encode()),
    }
    assert directory_sha256(folder) == _sha(lines.encode())
    cfg = DataConfig(train=[str(a), "stdlib:train"], eval=[str(folder)])
    assert data_hashes(cfg) == {str(a): _sha(a.read_bytes()), str(folder): _sha(lines.encode())}


def test_an_edit_in_place_changes_the_hash_and_the_same_bytes_do_not(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("x\n")
    before = source_hashes([str(a)])
    a.write_text("x\n")  # rewritten, same bytes
    assert source_hashes([str(a)]) == before
    a.write_text("y\n")
    assert source_hashes([str(a)]) == {str(a): _sha(b"y\n")} != before


def test_what_counts_as_a_change():
    old, new = _sha(b"old"), _sha(b"new")
    assert content_change({"a.jsonl": old}, {"a.jsonl": old}) is None
    assert content_change({"a.jsonl": old}, {"a.jsonl": new}) == (
        f"a.jsonl changed (sha256 {old[:12]} then, {new[:12]} now)"
    )
    assert content_change({"a.jsonl": old}, {"moved/a.jsonl": old}) is None  # the same bytes elsewhere
    assert content_change({"a.jsonl": old}, {"b.jsonl": new}) == (
        "b.jsonl is not a file it was made from (made from: a.jsonl)"
    )
    assert content_change({}, {"b.jsonl": new}) == (
        "b.jsonl is not a file it was made from (made from: no local file: built-in or Hub data)"
    )
    assert (
        content_change({"a.jsonl": old}, {}) is None
    )  # the recipe names no local file now: nothing to compare
    # a resumed run reads its data itself: every file it was trained on must still be there, by content
    assert content_change({"a.jsonl": old}, {}, every_file=True) == (
        "a.jsonl is no longer among the data (now: no local file)"
    )
    assert content_change({"a.jsonl": old, "b.jsonl": new}, {"c.jsonl": new}, every_file=True) == (
        "a.jsonl is no longer among the data (now: c.jsonl)"
    )
    assert content_change({"a.jsonl": old}, {"c.jsonl": old}, every_file=True) is None
    assert content_change(None, {"a.jsonl": new}) is None  # recorded before content was: cannot tell
