"""Fused KV handed from an adarag front end to ``vllm serve`` workers through a shared directory.

Under ``vllm serve`` the connector runs in vLLM's worker processes, out of reach of adarag's
in-process :class:`~adarag.engine.vllm.handoff.KVHandoff`. The front end (``engine.backend =
"vllm-server"``) writes each request's fused context as one safetensors file named by its
handoff id, atomically (a temporary name, then a rename); every worker reads only the KV heads
its tensor-parallel rank holds, memory-mapped; the front end deletes the file when the request
ends. The directory is configured on both sides (``engine.vllm_handoff`` and the connector's
``kv_connector_extra_config.handoff``): a request names an id, never a path.

Plain torch and safetensors: the front end needs no vLLM.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from adarag.engine.vllm.handoff import FusedContext
from adarag.errors import ConfigError

logger = logging.getLogger(__name__)

HANDOFF_ID = re.compile(r"^[0-9a-f]{32}$")
"""A handoff id: 32 lowercase hex digits (``uuid4().hex``); nothing else names a file."""

SUFFIX = ".kv.safetensors"


def checked_id(handoff_id: str) -> str:
    """``handoff_id`` itself.

    Raises:
        ValueError: ``handoff_id`` is not 32 lowercase hex digits.
    """
    if not HANDOFF_ID.match(handoff_id):
        raise ValueError(f"handoff id must be 32 lowercase hex digits, got {handoff_id!r}")
    return handoff_id


def tensors_of(context: FusedContext) -> dict[str, torch.Tensor]:
    """``context`` as the tensors safetensors stores: ``k`` and ``v``, contiguous, apart.

    safetensors stores no two tensors that share memory, so V is copied when it does.
    """
    k, v = context.k.contiguous(), context.v.contiguous()
    if k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
        v = v.clone()
    return {"k": k, "v": v}


class HandoffFiles:
    """Fused contexts as files in ``directory``, one per handoff id.

    Args:
        directory: A directory every front end and vLLM worker on the machine reaches (a tmpfs
            such as ``/dev/shm/adarag-handoff`` keeps the hand-over in memory).

    Raises:
        ConfigError: ``directory`` exists and is not a directory, or cannot be created.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(
                f"the KV handoff directory {self.directory} cannot be created ({err}); point "
                "engine.vllm_handoff and the connector's handoff at a writable directory"
            ) from err

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

    def write(self, handoff_id: str, context: FusedContext) -> None:
        """Store ``context`` under ``handoff_id``; readers never see a partial file."""
        target = self.path(handoff_id)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors_of(context), str(temporary))
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    def exists(self, handoff_id: str) -> bool:
        """Whether a context waits under ``handoff_id`` (False for a malformed id)."""
        return HANDOFF_ID.match(handoff_id) is not None and self.path(handoff_id).is_file()

    def read(self, handoff_id: str, heads: range | None = None) -> FusedContext | None:
        """The context under ``handoff_id``, only KV heads ``heads`` (all when None).

        Returns None, with a warning naming the reason, when the file is missing, unreadable
        or not a fused context: the caller lets vLLM compute those tokens itself.
        """
        try:
            with safe_open(str(self.path(handoff_id)), framework="pt") as handle:
                k, v = handle.get_slice("k"), handle.get_slice("v")
                if heads is None:
                    return FusedContext(k[:], v[:])
                selected = slice(heads.start, heads.stop)
                return FusedContext(k[:, :, selected], v[:, :, selected])
        except FileNotFoundError:
            logger.warning("no fused KV under handoff %s in %s", handoff_id, self.location)
        except (SafetensorError, OSError, KeyError, AssertionError, ValueError) as err:
            logger.warning("fused KV under handoff %s is unreadable: %s", handoff_id, err)
        return None

    def remove(self, handoff_id: str) -> None:
        """Delete the file of ``handoff_id`` if it is there."""
        self.path(handoff_id).unlink(missing_ok=True)

    def remove_stale(self, max_age_s: float) -> int:
        """Delete contexts older than ``max_age_s`` (left by a stopped front end); how many."""
        deadline = time.time() - max_age_s
        removed = 0
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                if path.stat().st_mtime < deadline:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


def as_storage(context: FusedContext, dtype: torch.dtype) -> FusedContext:
    """``context`` in ``dtype``, that of vLLM's KV cache (nothing written that vLLM rounds)."""
    return FusedContext(context.k.to(dtype), context.v.to(dtype))
