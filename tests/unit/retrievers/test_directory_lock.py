"""The Chroma directory lock is released cleanly by any exit but a crash, so no false warning."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys

import pytest

from adarag.retrievers.chroma import LOCK_FILE, DirectoryLock

HOLD_LOCK = (
    "import os, sys; from pathlib import Path; from adarag.retrievers.chroma import DirectoryLock;"
    "lock = DirectoryLock(Path(sys.argv[1])); lock.acquire(); print(os.getpid(), flush=True);"
)


def _run_holder(directory, ending: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", HOLD_LOCK + ending, str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(result.stdout.split()[0])


@pytest.mark.parametrize("ending", ["", "sys.exit(0)", "raise RuntimeError('uncaught')"])
def test_a_lock_never_released_is_released_when_the_interpreter_exits(tmp_path, caplog, ending):
    _run_holder(tmp_path, ending)
    assert (tmp_path / LOCK_FILE).read_text() == ""
    with caplog.at_level(logging.WARNING):
        lock = DirectoryLock(tmp_path)
        lock.acquire()
        lock.release()
    assert "recovered the lock" not in caplog.text


def test_a_process_that_dies_still_leaves_its_pid_and_is_reported(tmp_path, caplog):
    pid = _run_holder(tmp_path, "os._exit(0)")  # no clean-up runs, as when killed
    assert (tmp_path / LOCK_FILE).read_text() == str(pid)
    with caplog.at_level(logging.WARNING):
        lock = DirectoryLock(tmp_path)
        lock.acquire()
        lock.release()
    assert f"left by pid {pid}, which is no longer running" in caplog.text


def test_a_lock_dropped_without_release_is_released_when_collected(tmp_path):
    lock = DirectoryLock(tmp_path)
    lock.acquire()
    assert (tmp_path / LOCK_FILE).read_text() != ""
    del lock
    gc.collect()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_release_is_idempotent(tmp_path):
    lock = DirectoryLock(tmp_path)
    lock.acquire()
    lock.release()
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""
