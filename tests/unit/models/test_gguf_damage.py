"""Damaged GGUF files end in one line naming the file, what is wrong and what to do (models/gguf.check_gguf),
never a struct.error, IndexError or numpy "cannot reshape array" from deep inside gguf's reader.

The files are written here byte by byte from the GGUF layout (magic, version, counts; key/value metadata;
the tensor table; the aligned tensor data), so each part's first and last byte are known exactly: the oracle
for which part a file cut at byte n ends inside."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from draftsmith.models.gguf import check_gguf, locate, pretrained_source
from draftsmith.models.target import FrozenTarget, TargetConfig
from draftsmith.runtime.errors import UserError
from draftsmith.runtime.files import DamagedFile

F32, F16 = 0, 1
STRING, ARRAY, UINT32, INT32 = 8, 9, 4, 5


def _string(text: bytes, order: str) -> bytes:
    return struct.pack(order + "Q", len(text)) + text


def write_gguf(
    path: Path,
    version: int = 3,
    order: str = "<",
    alignment: int = 32,
    tensors: tuple[tuple[bytes, tuple[int, ...], int], ...] = ((b"w", (3, 2), F32), (b"b", (5,), F16)),
    value_type: int = STRING,
    stated_alignment: int | None = None,
) -> dict[str, int]:
    """A small valid GGUF file; returns where its header, metadata, tensor table and tensor data end."""
    p = lambda code, *v: struct.pack(order + code, *v)  # noqa: E731
    header = b"GGUF" + p("I", version) + p("Q", len(tensors)) + p("Q", 4)
    meta = _string(b"general.architecture", order) + p("I", value_type) + _string(b"llama", order)
    meta += (
        _string(b"general.alignment", order)
        + p("I", UINT32)
        + p("I", alignment if stated_alignment is None else stated_alignment)
    )
    meta += _string(b"tokenizer.ggml.tokens", order) + p("I", ARRAY) + p("I", STRING) + p("Q", 3)
    meta += b"".join(_string(t, order) for t in (b"<s>", b"a", b"bc"))
    meta += _string(b"tokenizer.ggml.token_type", order) + p("I", ARRAY) + p("I", INT32) + p("Q", 3)
    meta += p("3i", 1, 1, 1)
    table, blobs, offset, last_pad = b"", [], 0, 0
    for name, shape, kind in tensors:
        table += _string(name, order) + p("I", len(shape)) + b"".join(p("Q", d) for d in shape)
        table += p("I", kind) + p("Q", offset)
        blob = np.arange(int(np.prod(shape)), dtype=np.float32 if kind == F32 else np.float16).tobytes()
        last_pad = -len(blob) % alignment
        blob += b"\0" * last_pad
        blobs.append(blob)
        offset += len(blob)
    ends = {"header": len(header), "metadata": len(header + meta), "tensor table": len(header + meta + table)}
    pad = b"\0" * (-ends["tensor table"] % alignment)
    body = header + meta + table + pad + b"".join(blobs)[: offset - last_pad]  # the last tensor ends the file
    ends["tensor data"] = len(body)
    path.write_bytes(body)
    return ends


def _part(n: int, ends: dict[str, int]) -> str:
    return next(part for part, end in ends.items() if n < end)


def test_the_written_file_is_one_gguf_reads_whole(tmp_path):
    """The oracle file is a GGUF file: gguf's own reader reads its metadata and tensors, and check_gguf passes."""
    path = tmp_path / "m.gguf"
    write_gguf(path)
    reader = gguf.GGUFReader(path)
    assert [t.name for t in reader.tensors] == ["w", "b"]
    assert reader.tensors[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert reader.tensors[1].data.tolist() == [0, 1, 2, 3, 4]
    check_gguf(path)
    write_gguf(path, order=">")  # big-endian files are GGUF too
    check_gguf(path)


def test_a_file_cut_at_any_byte_names_the_file_and_the_part_it_ends_in(tmp_path):
    whole = tmp_path / "whole.gguf"
    ends = write_gguf(whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(DamagedFile) as info:
            check_gguf(cut)
        message = str(info.value)
        assert message.startswith(f"{cut} ends at byte {n} inside its {_part(n, ends)}"), (n, message)
        assert "\n" not in message and "download or copy it again" in message
    tail = str(pytest.raises(DamagedFile, check_gguf, cut).value)  # cut one byte short of the end
    assert f"the tensor data needs {len(data)} bytes" in tail


def test_a_cut_gguf_never_reaches_gguf_s_reader_errors(tmp_path):
    """What users met before: gguf's reader fails with struct.error or numpy's reshape error, no file named."""
    whole = tmp_path / "whole.gguf"
    ends = write_gguf(whole)
    cut = tmp_path / "cut.gguf"
    for n in (10, ends["metadata"] - 3, ends["tensor table"] - 3, len(whole.read_bytes()) - 4):
        cut.write_bytes(whole.read_bytes()[:n])
        with pytest.raises((struct.error, ValueError, IndexError)):
            gguf.GGUFReader(cut)
        with pytest.raises(DamagedFile, match=f"^{cut} ends at byte {n} "):
            pretrained_source(str(cut))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda p: p.write_bytes(b"PK\x03\x04" + p.read_bytes()[4:]),
            "is not a GGUF file: it starts with b'PK",
        ),
        (lambda p: p.write_bytes(b"{}"), "is not a GGUF file: it starts with b'{}'"),
        (lambda p: write_gguf(p, version=1), "is GGUF version 1; draftsmith reads versions 2 and 3"),
        (lambda p: write_gguf(p, version=7), "is GGUF version 7;"),
        (
            lambda p: write_gguf(p, value_type=13),
            "its metadata (entry 0 of 4) holds a metadata value of unknown type 13",
        ),
        (lambda p: write_gguf(p, tensors=((b"w", (1, 1, 1, 1, 1), F32),)), "a tensor of 5 dimensions"),
        (lambda p: write_gguf(p, tensors=((b"w", (4,), 250),)), "tensor 0 has ggml type 250"),
        (
            lambda p: write_gguf(p, stated_alignment=0),
            "its general.alignment is 0 (GGUF requires a multiple of 8)",
        ),
        (lambda p: write_gguf(p, stated_alignment=12), "its general.alignment is 12"),
    ],
)
def test_a_damaged_gguf_is_one_line_naming_the_file(tmp_path, edit, needle):
    path = tmp_path / "model.gguf"
    write_gguf(path)
    edit(path)
    with pytest.raises(DamagedFile) as info:
        check_gguf(path)
    message = str(info.value)
    assert message.startswith(str(path)) and needle in message and "\n" not in message


def test_frozen_target_load_refuses_a_cut_gguf_before_transformers_reads_it(tmp_path):
    whole = tmp_path / "whole.gguf"
    write_gguf(whole)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-7])
    with pytest.raises(UserError, match=f"^{cut} ends at byte .* inside its tensor data"):
        FrozenTarget.load(TargetConfig(path=str(cut)))


def test_the_packaged_gguf_passes_and_its_cut_copies_name_the_part(tmp_path):
    """The real SmolLM2 file: whole it passes; cut in its header, metadata, tensor table or data, it is named."""
    real = locate("smollm2-135m-instruct")
    check_gguf(real)
    reader = gguf.GGUFReader(real)
    table_end = reader.data_offset  # gguf's own reader: where the aligned tensor data begins
    assert (table_end, real.stat().st_size) == (1_785_664, 98_362_432)  # what tests/reliability/ cut at
    with real.open("rb") as f:
        head = f.read(table_end + 4096)
    cut = tmp_path / "smollm2.gguf"
    for n, part in (
        (12, "header"),
        (5000, "metadata"),
        (table_end - 40, "tensor table"),
        (table_end + 4096, "tensor data"),
    ):
        cut.write_bytes(head[:n])
        with pytest.raises(DamagedFile, match=f"ends at byte {n} inside its {part}"):
            check_gguf(cut)
    assert f"needs {real.stat().st_size} bytes" in str(pytest.raises(DamagedFile, check_gguf, cut).value)
