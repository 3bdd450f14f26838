"""File-system helpers shared by the stores on disk (the KV tier, the knowledge base's lock).

The directories adarag creates for what it stores (the KV tier, the knowledge base) are private
to their owner (mode 0700, :func:`make_private_directories`), whatever the umask: other local
users can neither list nor read the chunks and their KV. A directory that already exists keeps
its mode, so a deployment that shares one with a group creates it first with the mode it wants.
"""

from __future__ import annotations

import errno
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


PRIVATE_DIRECTORY_MODE = 0o700
"""Mode of the directories adarag creates for what it stores."""


def make_private_directories(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700; existing ones are left as they are.

    Raises:
        OSError: A directory cannot be created, or something other than one is in the way.
    """
    if path.is_dir():
        return
    if path.parent != path:
        make_private_directories(path.parent)
    try:
        path.mkdir(mode=PRIVATE_DIRECTORY_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None
