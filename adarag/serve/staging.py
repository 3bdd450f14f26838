"""Staging folders of uploads: one per upload while it is received and parsed.

Each upload is written to ``<documents>/.incoming/<pid>-<random>/`` and removed once it is kept
or refused. A server that crashed meanwhile leaves its folder behind (up to
``serve.max_upload_bytes`` each); :func:`sweep_staging` runs when a server opens the documents
directory and removes those of processes that are no longer running, any other older than an
hour (a process of another host or container, or one whose pid was reused), and any whose name
is not of this form.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from adarag.files import make_private_directories, process_running

logger = logging.getLogger(__name__)

STAGING = ".incoming"
STALE_AFTER_S = 3600.0


def new_staging_directory(documents: Path) -> Path:
    """A new private staging folder under ``documents``, named for this process."""
    staging = documents / STAGING / f"{os.getpid()}-{uuid.uuid4().hex}"
    make_private_directories(staging)
    return staging


def sweep_staging(documents: Path) -> int:
    """Remove the staging folders left by processes that ended; returns how many."""
    try:
        entries = list((documents / STAGING).iterdir())
    except OSError:
        return 0  # none yet
    removed = 0
    for entry in entries:
        if _is_abandoned(entry):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed += 1
    if removed:
        logger.info("removed %d staged uploads left by ended processes", removed)
    return removed


def _is_abandoned(entry: Path) -> bool:
    pid_text = entry.name.split("-", 1)[0]
    if not pid_text.isdigit() or "-" not in entry.name:
        return True
    try:
        age_s = time.time() - entry.lstat().st_mtime
    except OSError:
        return False  # gone already
    return age_s > STALE_AFTER_S or not process_running(int(pid_text))
