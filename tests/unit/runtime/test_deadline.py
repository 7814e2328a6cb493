"""`Deadline`: Ctrl-C for the main thread when the time is up, never after the block ended."""

from __future__ import annotations

import time

import pytest

from draftsmith.runtime.deadline import Deadline


def test_a_block_still_running_at_its_deadline_is_interrupted():
    began = time.perf_counter()
    with pytest.raises(KeyboardInterrupt), Deadline(0.2) as deadline:
        while time.perf_counter() - began < 10:
            time.sleep(0.01)
    assert deadline.fired and 0.15 < time.perf_counter() - began < 5


def test_a_block_that_ends_first_is_never_interrupted():
    with Deadline(0.2) as deadline:
        pass
    time.sleep(0.5)  # past the deadline: a KeyboardInterrupt here would fail the test
    assert not deadline.fired


def test_no_deadline_waits_for_the_block():
    with Deadline(None) as deadline:
        time.sleep(0.3)
    assert not deadline.fired


def test_the_stop_handler_of_the_block_gets_it_as_ctrl_c(monkeypatch):
    """A SIGINT handler installed inside the block (training's StopRequest) handles the deadline instead."""
    from draftsmith.train.core.stop import StopRequest

    began = time.perf_counter()
    with Deadline(0.2) as deadline, StopRequest() as stop:
        while not stop.requested and time.perf_counter() - began < 10:
            time.sleep(0.01)
    assert deadline.fired and stop.requested
