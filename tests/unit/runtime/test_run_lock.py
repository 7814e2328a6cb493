"""`RunLock`: one writer per directory; a live holder refuses a second writer in one line naming it, a dead
holder's lock is taken over, another host's lock is never taken over, release removes only our own lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from draftsmith.runtime.run_lock import LOCK_NAME, DirectoryBusy, RunLock


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_second_writer_refused_while_the_first_holds_it(tmp_path):
    with RunLock(tmp_path, "training") as first:
        info = json.loads(first.path.read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        with pytest.raises(
            DirectoryBusy, match=rf"in use by training, pid {os.getpid()} on {socket.gethostname()}"
        ):
            RunLock(tmp_path, "export").acquire()
    assert not (tmp_path / LOCK_NAME).exists()
    RunLock(tmp_path, "training").acquire().release()  # free again


def test_a_dead_holders_lock_is_taken_over_with_a_notice(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    lock = RunLock(tmp_path, "training").acquire()
    assert lock.notice and "took over the stale lock" in lock.notice
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()


def test_another_hosts_lock_is_never_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text(
        json.dumps({"pid": 1, "host": "elsewhere.example", "purpose": "caching"})
    )
    with pytest.raises(DirectoryBusy, match=r"on another host: if it is gone, delete .*\.draftsmith\.lock"):
        RunLock(tmp_path, "training").acquire()


def test_release_leaves_a_lock_that_is_not_ours(tmp_path):
    lock = RunLock(tmp_path, "training").acquire()
    lock.path.write_text(json.dumps({"pid": 1, "host": "elsewhere.example"}))  # replaced by someone else
    lock.release()
    assert lock.path.exists()


def test_a_lock_file_still_being_written_is_read_again_not_called_unreadable(tmp_path, monkeypatch):
    # The winner of two simultaneous starts creates the file (O_EXCL), then writes its line: the loser must
    # wait for the line instead of reporting an unreadable lock.
    import threading

    lock = tmp_path / LOCK_NAME
    lock.write_text("")  # created, not yet filled
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": "training", "started": 0}
    filler = threading.Timer(0.3, lambda: lock.write_text(json.dumps(holder) + "\n"))
    filler.start()
    try:
        with pytest.raises(DirectoryBusy, match="in use by training"):
            RunLock(tmp_path, "training").acquire()
    finally:
        filler.cancel()


def test_a_lock_file_that_stays_empty_is_unreadable(tmp_path, monkeypatch):
    import draftsmith.runtime.run_lock as run_lock

    monkeypatch.setattr(run_lock, "UNREADABLE_WAIT_S", 0.2)
    (tmp_path / LOCK_NAME).write_text("")
    with pytest.raises(DirectoryBusy, match="unreadable lock file"):
        RunLock(tmp_path, "training").acquire()
