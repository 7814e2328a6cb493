"""`run_main`: bad input and disk faults (full, read-only, not writable) become one line; bugs keep their
traceback."""

import errno

import pytest

from draftsmith.runtime.errors import UserError, run_main


def _raise(exc):
    def main(argv):
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/proc/run/checkpoint-4.tmp/model.safetensors"),
            "no space left on the filesystem mounted at /proc, ",
        ),
        # What safetensors and torch.save raise on a full 1 MB tmpfs (measured): their own types, not OSError.
        (
            RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
            "no space left on",
        ),
        (
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
            "no space left on",
        ),
        (
            OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run"),
            "/mnt/ro/run is on a read-only filesystem",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), "permission denied: /root/x"),
        (UserError("busy"), "busy"),
    ],
)
def test_faults_become_one_line(exc, expected, capsys):
    assert run_main(_raise(exc)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and "Traceback" not in err


def test_the_filesystem_that_filled_is_named_by_its_mount_point():
    from pathlib import Path

    from draftsmith.runtime.errors import mount_point

    assert mount_point(Path("/proc/self/status")) == Path("/proc")
    assert mount_point(Path("/")) == Path("/")


def test_ctrl_c_is_one_line_with_status_130(capsys):
    from draftsmith.runtime.errors import Interrupted

    assert run_main(_raise(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert run_main(_raise(Interrupted("interrupted: 3 rows kept, rerun to continue"))) == 130
    assert capsys.readouterr().err == "interrupted: 3 rows kept, rerun to continue\n"


def test_a_bug_keeps_its_traceback():
    with pytest.raises(KeyError):
        run_main(_raise(KeyError("x")))
    with pytest.raises(RuntimeError):
        run_main(_raise(RuntimeError("shape mismatch")))


def test_require_space_names_both_figures(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from draftsmith.runtime.errors import DiskFull, format_bytes, require_space

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 2_500_000_000, 2_500_000_000))
    require_space(tmp_path / "run" / "not-yet", 2_400_000_000, "checkpoint-4")  # fits: no error
    with pytest.raises(DiskFull) as err:
        require_space(tmp_path / "run" / "not-yet", 3_000_000_000, "checkpoint-4")
    assert str(err.value).startswith(
        f"no space left on {tmp_path}/run/not-yet: 2.5 GB free, checkpoint-4 needs ~3.0 GB"
    )
    assert [format_bytes(n) for n in (999, 1000, 1_234_567, 5 * 10**12)] == [
        "999 B",
        "1.0 KB",
        "1.2 MB",
        "5000.0 GB",
    ]
