"""Real file-system faults for the reliability suite: a small tmpfs, filled or made read-only,
and a layer that fails ``os.open`` of chosen files with a chosen errno (for errors a root
test process cannot provoke with permissions)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(mountpoint: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` KiB mounted at ``mountpoint`` (skips where mounting is denied)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(directory: Path) -> int:
    """Write a filler file until the file system is full; returns the bytes written."""
    written = 0
    block = b"\0" * 4096
    with (directory / "filler").open("wb", buffering=0) as handle:
        while True:
            try:
                written += handle.write(block)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
                return written


def remount_read_only(mountpoint: Path) -> None:
    """Make a mounted tmpfs read-only."""
    subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)


@contextmanager
def failing_open(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool], error: int
) -> Iterator[list[str]]:
    """``os.open`` of every path ``fails`` accepts raises ``error``; yields the paths refused."""
    refused: list[str] = []
    real_open = os.open

    def open_or_fail(path, flags, *args, **kwargs):
        if fails(os.fspath(path)):
            refused.append(os.fspath(path))
            raise OSError(error, os.strerror(error), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", open_or_fail)
        yield refused


@contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Every file descriptor of this process is taken (a real EMFILE), then given back."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    taken: list[int] = []
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as err:
                assert err.errno == errno.EMFILE, err
                break
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
