"""Fused KV handed from an adarag front end to ``vllm serve`` workers through a private directory.

Under ``vllm serve`` the connector runs in vLLM's worker processes, out of reach of adarag's
in-process :class:`~adarag.engine.vllm.handoff.KVHandoff`. The front end (``engine.backend =
"vllm-server"``) writes each request's fused context as one signed file named by its handoff id
(:mod:`~adarag.engine.vllm.handoff_format`), atomically (a temporary name, then a rename), mode
0600; every worker verifies it and reads only the KV heads its tensor-parallel rank holds; the
front end deletes the file when the request ends, and a sweep deletes what a killed front end
left. The directory is configured on both sides (``engine.vllm_handoff`` and the connector's
``kv_connector_extra_config.handoff``): a request names an id, never a path.

The directory is private: created with mode 0700, and refused when it belongs to another user or
others may write to it (so nobody else can plant, replace or delete a hand-over). The front end
and the replicas run as one user.

Plain torch and safetensors: the front end needs no vLLM.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from pathlib import Path
from typing import BinaryIO

import torch

from adarag.engine.vllm.handoff import HANDOFF_ID, FusedContext, HandoffBinding
from adarag.engine.vllm.handoff_format import MAX_HEADER_BYTES, HandoffRefused, HandoffSigner
from adarag.errors import ConfigError

logger = logging.getLogger(__name__)

SUFFIX = ".kv.safetensors"
TEMPORARY_SUFFIX = ".tmp"
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def checked_id(handoff_id: str) -> str:
    """``handoff_id`` itself.

    Raises:
        ValueError: ``handoff_id`` is not 32 lowercase hex digits.
    """
    if not HANDOFF_ID.match(handoff_id):
        raise ValueError(f"handoff id must be 32 lowercase hex digits, got {handoff_id!r}")
    return handoff_id


class HandoffFiles:
    """Signed fused contexts as files in a private ``directory``, one per handoff id.

    Args:
        directory: A directory every front end and vLLM worker on the machine reaches (a tmpfs
            such as ``/dev/shm/adarag-handoff`` keeps the hand-over in memory).
        signer: Signs and verifies the hand-overs (the key the other side holds too).

    Raises:
        ConfigError: ``directory`` cannot be created, is not a directory, belongs to another
            user, or others may write to it.
    """

    def __init__(self, directory: str | Path, signer: HandoffSigner) -> None:
        self.directory = Path(directory)
        self.signer = signer
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            _make_directory(self.directory)
            info = os.lstat(self.directory)
        except OSError as err:
            raise ConfigError(
                f"the KV hand-over directory {self.directory} cannot be created ({err}); point "
                "engine.vllm_handoff and the connector's handoff at a writable directory"
            ) from err
        problem = _exposure(info)
        if problem is not None:
            raise ConfigError(
                f"the KV hand-over directory {self.directory} {problem}, so someone else could "
                "plant or replace the KV a replica reads; remove it (or point engine.vllm_handoff "
                "and the connector's handoff at a directory of your own: adarag creates it with "
                "mode 0700)"
            )

    @property
    def location(self) -> str:
        """The directory, for messages."""
        return str(self.directory)

    def path(self, handoff_id: str) -> Path:
        """The file of ``handoff_id``.

        Raises:
            ValueError: ``handoff_id`` is not 32 lowercase hex digits.
        """
        return self.directory / f"{checked_id(handoff_id)}{SUFFIX}"

    def write(self, binding: HandoffBinding, context: FusedContext) -> None:
        """Store ``context`` signed for ``binding``; readers never see a partial file."""
        data = self.signer.encode(binding, context)
        target = self.path(binding.handoff_id)
        temporary = target.with_name(f".{target.name}.{os.getpid()}{TEMPORARY_SUFFIX}")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    def check(self, binding: HandoffBinding) -> str | None:
        """Why the hand-over of ``binding`` cannot be used (its header only), or None if it can."""
        try:
            with _open_regular(self.path(binding.handoff_id)) as handle:
                prefix = handle.read(8)
                length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
                prefix += handle.read(min(length, MAX_HEADER_BYTES))
            self.signer.check_header(prefix, binding)
        except FileNotFoundError:
            return f"no fused KV waits under handoff {binding.handoff_id} in {self.location}"
        except (OSError, HandoffRefused, ValueError) as err:
            return f"fused KV under handoff {binding.handoff_id} is refused: {err}"
        return None

    def read(self, binding: HandoffBinding, heads: range | None = None) -> FusedContext | None:
        """The verified context of ``binding``, KV heads ``heads`` only (all when None).

        Returns None, with a warning naming the reason, when the file is missing, unreadable or
        fails a check: the caller lets vLLM compute those tokens itself.
        """
        try:
            with _open_regular(self.path(binding.handoff_id)) as handle:
                data = handle.read()
            return self.signer.decode(data, binding, heads)
        except FileNotFoundError:
            logger.warning("no fused KV under handoff %s in %s", binding.handoff_id, self.location)
        except (OSError, HandoffRefused, ValueError) as err:
            logger.warning("fused KV under handoff %s is refused: %s", binding.handoff_id, err)
        return None

    def remove(self, handoff_id: str) -> None:
        """Delete the file of ``handoff_id`` if it is there."""
        self.path(handoff_id).unlink(missing_ok=True)

    def remove_stale(self, max_age_s: float) -> int:
        """Delete hand-overs (and temporary files) older than ``max_age_s``; how many.

        They were left by a front end that stopped before it deleted them.
        """
        deadline = time.time() - max_age_s
        removed = 0
        for path in [
            *self.directory.glob(f"*{SUFFIX}"),
            *self.directory.glob(f".*{SUFFIX}.*{TEMPORARY_SUFFIX}"),
        ]:
            try:
                if path.lstat().st_mtime < deadline:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


def _make_directory(directory: Path) -> None:
    """Create ``directory`` with mode 0700; whatever is there already is checked afterwards."""
    try:
        directory.mkdir(mode=DIRECTORY_MODE)
    except FileExistsError:
        pass


def _exposure(info: os.stat_result) -> str | None:
    """What makes a hand-over directory unsafe to use (``lstat`` of it), or None."""
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory (a link or a file is there)"
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return f"may be written by other users (mode {mode:04o})"
    return None


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, only if it is a regular file (no link, FIFO or device).

    Raises:
        FileNotFoundError: Nothing is there.
        OSError: Something other than a regular file is there, or it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


def as_storage(context: FusedContext, dtype: torch.dtype) -> FusedContext:
    """``context`` in ``dtype``, that of vLLM's KV cache (nothing written that vLLM rounds)."""
    return FusedContext(context.k.to(dtype), context.v.to(dtype))
