"""Fused KV handed to ``vllm serve`` workers through a Redis-protocol server (Redis, Valkey).

For replicas on other machines than the front end. The same contract as
:class:`~adarag.engine.vllm.handoff_files.HandoffFiles`: one signed value per handoff id
(:mod:`~adarag.engine.vllm.handoff_format`), written with a time-to-live, verified by every
worker (each keeps only its rank's KV heads), deleted by the front end when the request ends. A
value the front end never deleted (it was killed) expires on the server. Whoever can write the
database can replace a value or list the keys, but a value that is not the front end's, for
this request's prompt, under the shared key, is refused.

The server's password comes from ``password`` (``$ADARAG_HANDOFF_PASSWORD`` or a file), not the
URL: vLLM logs its ``kv_connector_extra_config`` and a process listing shows its command line.
"""

from __future__ import annotations

import logging
from typing import Any

from adarag.config import redact_url
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding
from adarag.engine.vllm.handoff_files import checked_id
from adarag.engine.vllm.handoff_format import MAX_HEADER_BYTES, HandoffRefused, HandoffSigner
from adarag.errors import MissingDependencyError

logger = logging.getLogger(__name__)

KEY_PREFIX = "adarag:handoff:"


class HandoffRedis:
    """Signed fused contexts as values on a Redis-protocol server, one per handoff id.

    Args:
        url: ``redis://[user@]host:port/db`` (``rediss://`` for TLS).
        signer: Signs and verifies the hand-overs (the key the other side holds too).
        ttl_s: Seconds a value lives if nobody deletes it.
        password: The server's AUTH password; None: the URL's, if any.

    Raises:
        MissingDependencyError: The ``redis`` package is not installed (the ``remote`` extra).
    """

    def __init__(
        self,
        url: str,
        signer: HandoffSigner,
        ttl_s: float,
        timeout_s: float = 10.0,
        password: str | None = None,
    ) -> None:
        try:
            import redis
        except ImportError as err:
            raise MissingDependencyError("redis", "remote") from err
        self.location = redact_url(url)
        self.signer = signer
        self.ttl_ms = max(1, int(ttl_s * 1000))
        options: dict[str, Any] = {} if password is None else {"password": password}
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **options
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

    def key(self, handoff_id: str) -> str:
        """The server key of ``handoff_id``.

        Raises:
            ValueError: ``handoff_id`` is not 32 lowercase hex digits.
        """
        return f"{KEY_PREFIX}{checked_id(handoff_id)}"

    def write(self, binding: HandoffBinding, context: FusedContext) -> None:
        """Store ``context`` signed for ``binding``.

        Raises:
            ConnectionError: The server cannot be reached or refused the value.
        """
        data = self.signer.encode(binding, context)
        try:
            self._client.set(self.key(binding.handoff_id), data, px=self.ttl_ms)
        except self._errors as err:
            raise ConnectionError(f"cannot store fused KV on {self.location}: {err}") from err

    def check(self, binding: HandoffBinding) -> str | None:
        """Why the hand-over of ``binding`` cannot be used (its header only), or None if it can."""
        try:
            prefix = self._client.getrange(self.key(binding.handoff_id), 0, MAX_HEADER_BYTES + 7)
            if not prefix:
                return f"no fused KV waits under handoff {binding.handoff_id} on {self.location}"
            self.signer.check_header(prefix, binding)
        except self._errors as err:
            return f"the KV hand-over server {self.location} failed: {err}"
        except (HandoffRefused, ValueError) as err:
            return f"fused KV under handoff {binding.handoff_id} is refused: {err}"
        return None

    def read(self, binding: HandoffBinding, heads: range | None = None) -> FusedContext | None:
        """The verified context of ``binding``, KV heads ``heads`` only (all when None).

        Returns None, with a warning naming the reason, when the value is missing, fails a check
        or the server is unreachable: the caller lets vLLM compute those tokens itself.
        """
        try:
            value = self._client.get(self.key(binding.handoff_id))
            if value is None:
                logger.warning(
                    "no fused KV under handoff %s on %s", binding.handoff_id, self.location
                )
                return None
            return self.signer.decode(value, binding, heads)
        except self._errors as err:
            logger.warning("KV hand-over server %s unreachable: %s", self.location, err)
        except (HandoffRefused, ValueError) as err:
            logger.warning("fused KV under handoff %s is refused: %s", binding.handoff_id, err)
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
