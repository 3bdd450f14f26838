"""File-system helpers shared by the stores on disk (the KV tier, the knowledge base's lock)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


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


def unlink_quietly(path: Path) -> None:
    """Delete ``path`` if it is there; a file system that refuses (read-only) keeps it."""
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        logger.debug("cannot delete %s (%s)", path, err)
