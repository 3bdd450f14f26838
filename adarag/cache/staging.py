"""Staging files of the disk tier: named for their writer, removed once it is gone.

An entry is written under ``.tmp-<namespace>-<pid>-<random>``, synced and renamed into place.
``<namespace>`` is a digest of the host (its boot) and the writer's PID namespace: a pid means
something only inside it. A store opening the directory removes the staging files of dead
writers of its own namespace at once, and those of another host or container (two containers
sharing a volume) only once they are :data:`STAGING_MAX_AGE_S` old.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path

from adarag.files import process_running, unlink_quietly

STAGING_PREFIX = ".tmp-"
STAGING_MAX_AGE_S = 3600.0
"""A staging file of another host or PID namespace is removed once it is this old."""


def writer_id() -> str:
    """``<namespace>-<pid>``: the host and PID namespace of this process, and its pid there."""
    return f"{_pid_namespace()}-{os.getpid()}"


def _pid_namespace() -> str:
    """A short digest of this host (boot) and PID namespace: pids compare only within it."""
    parts = [socket.gethostname()]
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        pass  # no /proc: the host name alone
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=6).hexdigest()


def remove_orphaned_staging(directory: Path) -> None:
    """Delete staging files of a crashed writer: a dead pid of this namespace, else by age."""
    namespace = _pid_namespace()
    now = time.time()
    for staging in directory.glob(f"{STAGING_PREFIX}*"):
        fields = staging.name.removeprefix(STAGING_PREFIX).split("-")
        if len(fields) == 3 and fields[0] == namespace and fields[1].isdigit():
            if process_running(int(fields[1])):
                continue  # a live writer of this namespace
        else:  # another host or container (or an older name): its pid means nothing here
            try:
                age_s = now - staging.lstat().st_mtime
            except FileNotFoundError:
                continue
            if age_s < STAGING_MAX_AGE_S:
                continue
        unlink_quietly(staging)
