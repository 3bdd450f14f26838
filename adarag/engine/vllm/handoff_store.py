"""Where fused KV waits between an adarag front end and ``vllm serve`` workers.

A directory on the machine (or a shared file system), or a Redis-protocol server the replicas
reach. Both sides name the same location: ``engine.vllm_handoff`` on the front end, and the
connector's ``kv_connector_extra_config.handoff`` on every replica.
"""

from __future__ import annotations

from typing import Protocol

from adarag.engine.vllm.handoff import FusedContext
from adarag.engine.vllm.handoff_files import HandoffFiles

SERVER_SCHEMES = ("redis://", "rediss://", "unix://")
"""A location starting with one of these is a Redis-protocol server; anything else a directory."""


class HandoffStore(Protocol):
    """Fused contexts by handoff id (:class:`HandoffFiles`, :class:`HandoffRedis`)."""

    @property
    def location(self) -> str:
        """Where the contexts are, for messages (a server URL without its password)."""
        ...

    def write(self, handoff_id: str, context: FusedContext) -> None:
        """Store ``context`` under ``handoff_id`` (raises ``OSError`` when it cannot)."""
        ...

    def exists(self, handoff_id: str) -> bool:
        """Whether a context waits under ``handoff_id``."""
        ...

    def read(self, handoff_id: str, heads: range | None = None) -> FusedContext | None:
        """The context (KV heads ``heads`` only), or None with the reason logged."""
        ...

    def remove(self, handoff_id: str) -> None:
        """Delete the context of ``handoff_id`` if it is there."""
        ...

    def remove_stale(self, max_age_s: float) -> int:
        """Delete contexts older than ``max_age_s``; how many."""
        ...


def open_handoff(location: str, ttl_s: float = 600.0) -> HandoffStore:
    """The hand-over at ``location``: a ``redis://`` URL or a directory.

    Args:
        location: A server URL (``redis://``, ``rediss://``, ``unix://``) or a directory path.
        ttl_s: How long a context the front end never deleted lives on a server (its expiry;
            only writes set it).

    Raises:
        ConfigError: The directory cannot be created.
        MissingDependencyError: A server URL, but the ``redis`` package is not installed.
    """
    if location.startswith(SERVER_SCHEMES):
        from adarag.engine.vllm.handoff_redis import HandoffRedis

        return HandoffRedis(location, ttl_s)
    return HandoffFiles(location)
