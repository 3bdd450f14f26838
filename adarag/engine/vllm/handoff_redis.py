"""Fused KV handed to ``vllm serve`` workers through a Redis-protocol server (Redis, Valkey).

For replicas on other machines than the front end. The same contract as
:class:`~adarag.engine.vllm.handoff_files.HandoffFiles`: one value per handoff id (safetensors
bytes of K and V), written with a time-to-live, read by every worker (each keeps only its rank's
KV heads), deleted by the front end when the request ends. A value the front end never deleted
(it was killed) expires on the server.
"""

from __future__ import annotations

import logging
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load, save

from adarag.config import redact_url
from adarag.engine.vllm.handoff import FusedContext
from adarag.engine.vllm.handoff_files import HANDOFF_ID, checked_id, tensors_of
from adarag.errors import MissingDependencyError

logger = logging.getLogger(__name__)

KEY_PREFIX = "adarag:handoff:"


class HandoffRedis:
    """Fused contexts as values on a Redis-protocol server, one per handoff id.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
        ttl_s: Seconds a value lives if nobody deletes it.

    Raises:
        MissingDependencyError: The ``redis`` package is not installed (the ``remote`` extra).
    """

    def __init__(self, url: str, ttl_s: float, timeout_s: float = 10.0) -> None:
        try:
            import redis
        except ImportError as err:
            raise MissingDependencyError("redis", "remote") from err
        self.location = redact_url(url)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

    def key(self, handoff_id: str) -> str:
        """The server key of ``handoff_id``.

        Raises:
            ValueError: ``handoff_id`` is not 32 lowercase hex digits.
        """
        return f"{KEY_PREFIX}{checked_id(handoff_id)}"

    def write(self, handoff_id: str, context: FusedContext) -> None:
        """Store ``context`` under ``handoff_id``.

        Raises:
            ConnectionError: The server cannot be reached or refused the value.
        """
        try:
            self._client.set(self.key(handoff_id), save(tensors_of(context)), px=self.ttl_ms)
        except self._errors as err:
            raise ConnectionError(f"cannot store fused KV on {self.location}: {err}") from err

    def exists(self, handoff_id: str) -> bool:
        """Whether a context waits under ``handoff_id`` (False for a malformed id or no server)."""
        if not HANDOFF_ID.match(handoff_id):
            return False
        try:
            return bool(self._client.exists(self.key(handoff_id)))
        except self._errors as err:
            logger.warning("KV handoff server %s unreachable: %s", self.location, err)
            return False

    def read(self, handoff_id: str, heads: range | None = None) -> FusedContext | None:
        """The context under ``handoff_id``, only KV heads ``heads`` (all when None).

        Returns None, with a warning naming the reason, when the value is missing, unreadable or
        the server unreachable: the caller lets vLLM compute those tokens itself.
        """
        try:
            value = self._client.get(self.key(handoff_id))
            if value is None:
                logger.warning("no fused KV under handoff %s on %s", handoff_id, self.location)
                return None
            tensors = load(value)
            k, v = tensors["k"], tensors["v"]
            if heads is not None:
                k, v = k[:, :, heads.start : heads.stop], v[:, :, heads.start : heads.stop]
            return FusedContext(k.contiguous(), v.contiguous())
        except self._errors as err:
            logger.warning("KV handoff server %s unreachable: %s", self.location, err)
        except (SafetensorError, KeyError, AssertionError, ValueError) as err:
            logger.warning("fused KV under handoff %s is unreadable: %s", handoff_id, err)
        return None

    def remove(self, handoff_id: str) -> None:
        """Delete the value of ``handoff_id`` if it is there."""
        try:
            self._client.delete(self.key(handoff_id))
        except self._errors as err:  # it expires on its own
            logger.warning("cannot delete handoff %s on %s: %s", handoff_id, self.location, err)

    def remove_stale(self, max_age_s: float) -> int:
        """Nothing to do: values the front end did not delete expire on the server."""
        return 0
