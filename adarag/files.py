"""File-system helpers shared by the stores on disk (the KV tier, the knowledge base's lock)."""

from __future__ import annotations

import os


def process_running(pid: int) -> bool:
    """Whether a process with this pid exists (this process included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by another user
    return True
