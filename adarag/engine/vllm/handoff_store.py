"""Where fused KV waits between an adarag front end and ``vllm serve`` workers.

A private directory on the machine (or a shared file system), or a Redis-protocol server the
replicas reach. Both sides name the same location: ``engine.vllm_handoff`` on the front end, and
the connector's ``kv_connector_extra_config.handoff`` on every replica; both hold the same
hand-over key, which signs every hand-over (:mod:`~adarag.engine.vllm.handoff_format`).

A replica's connector reads its settings from ``kv_connector_extra_config`` (vLLM logs it, so it
holds no secret): ``handoff``, and optionally ``handoff_key_file``, ``handoff_password_file`` and
``handoff_max_age_s``; the key itself comes from that file or ``$ADARAG_HANDOFF_KEY``, a server
password from its file or ``$ADARAG_HANDOFF_PASSWORD``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from adarag.config import EngineConfig, read_key_file, redact_url, secret_from_env
from adarag.config.engine import HANDOFF_KEY_ENV, HANDOFF_PASSWORD_ENV
from adarag.config.secrets import read_secret_file
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.errors import ConfigError

logger = logging.getLogger(__name__)

SERVER_SCHEMES = ("redis://", "rediss://", "unix://")
"""A location starting with one of these is a Redis-protocol server; anything else a directory."""

DEFAULT_MAX_AGE_S = 600.0
"""Age past which a replica's sweep deletes a hand-over (``engine.vllm_server_timeout_s``)."""


class HandoffStore(Protocol):
    """Signed fused contexts by handoff id (:class:`HandoffFiles`, :class:`HandoffRedis`)."""

    @property
    def location(self) -> str:
        """Where the contexts are, for messages (a server URL without its password)."""
        ...

    def write(self, binding: HandoffBinding, context: FusedContext) -> None:
        """Store ``context`` signed for ``binding`` (raises ``OSError`` when it cannot)."""
        ...

    def check(self, binding: HandoffBinding) -> str | None:
        """Why the hand-over of ``binding`` cannot be used (its header only), or None."""
        ...

    def read(self, binding: HandoffBinding, heads: range | None = None) -> FusedContext | None:
        """The verified context (KV heads ``heads`` only), or None with the reason logged."""
        ...

    def remove(self, handoff_id: str) -> None:
        """Delete the context of ``handoff_id`` if it is there."""
        ...

    def remove_stale(self, max_age_s: float) -> int:
        """Delete contexts older than ``max_age_s``; how many."""
        ...


def open_handoff(
    location: str, key: bytes, ttl_s: float = DEFAULT_MAX_AGE_S, password: str | None = None
) -> HandoffStore:
    """The hand-over at ``location``: a ``redis://`` URL or a directory.

    Args:
        location: A server URL (``redis://``, ``rediss://``, ``unix://``) or a directory path.
        key: The hand-over key shared by the front end and the replicas.
        ttl_s: How long a context the front end never deleted lives on a server (its expiry;
            only writes set it).
        password: A server's AUTH password (instead of one in the URL).

    Raises:
        ConfigError: The directory cannot be created, or is not private to this user.
        MissingDependencyError: A server URL, but the ``redis`` package is not installed.
    """
    signer = HandoffSigner(key)
    if location.startswith(SERVER_SCHEMES):
        from adarag.engine.vllm.handoff_redis import HandoffRedis

        return HandoffRedis(location, signer, ttl_s, password=password)
    return HandoffFiles(location, signer)


def open_front_end_handoff(config: EngineConfig) -> HandoffStore:
    """The front end's hand-over (``engine.vllm_handoff``, its key and password).

    Raises:
        ConfigError: No hand-over key, its file is unreadable or open to others, or the
            directory is not private to this user.
    """
    key = config.handoff_key_bytes()
    if key is None:
        raise ConfigError(
            f"no hand-over key: set ${HANDOFF_KEY_ENV} or engine.vllm_handoff_key_file, the key "
            "every replica's connector holds too"
        )
    password = config.vllm_handoff_password
    return open_handoff(
        config.vllm_handoff,
        key,
        config.vllm_server_timeout_s,
        None if password is None else password.get_secret_value(),
    )


def open_replica_handoff(extra: Mapping[str, Any]) -> tuple[HandoffStore, float] | None:
    """A replica's hand-over and the age past which it sweeps one, from its connector settings.

    Args:
        extra: The connector's ``kv_connector_extra_config``.

    Returns:
        None when ``handoff`` is not set (the in-process backend feeds the connector itself).

    Raises:
        ConfigError: A setting is malformed, or there is no key (file or environment).
    """
    location = extra.get("handoff")
    if location is None:
        return None
    if not isinstance(location, str) or not location:
        raise ConfigError(
            "kv_connector_extra_config.handoff must name the hand-over directory or redis:// URL"
        )
    key = _replica_key(extra, location)
    max_age_s = extra.get("handoff_max_age_s", DEFAULT_MAX_AGE_S)
    if not isinstance(max_age_s, int | float) or not math.isfinite(max_age_s) or max_age_s <= 0:
        raise ConfigError(
            f"kv_connector_extra_config.handoff_max_age_s must be a positive number of seconds, "
            f"got {max_age_s!r}"
        )
    if redact_url(location) != location:
        logger.warning(
            "the hand-over URL %s carries a secret, which vLLM logs and a process listing shows; "
            "give the password in $%s or kv_connector_extra_config.handoff_password_file",
            redact_url(location),
            HANDOFF_PASSWORD_ENV,
        )
    return open_handoff(location, key, max_age_s, _replica_password(extra)), float(max_age_s)


def _replica_password(extra: Mapping[str, Any]) -> str | None:
    password_file = extra.get("handoff_password_file")
    if password_file is not None:
        setting = "kv_connector_extra_config.handoff_password_file"
        return read_secret_file(Path(str(password_file)), setting).decode()
    secret = secret_from_env(HANDOFF_PASSWORD_ENV, check=False)
    return None if secret is None else secret.get_secret_value()


def _replica_key(extra: Mapping[str, Any], location: str) -> bytes:
    key_file = extra.get("handoff_key_file")
    if key_file is not None:
        return read_key_file(Path(str(key_file)), "kv_connector_extra_config.handoff_key_file")
    secret = secret_from_env(HANDOFF_KEY_ENV)
    if secret is None:
        raise ConfigError(
            f"adarag's connector reads hand-overs from {redact_url(location)} but holds no "
            f"hand-over key: set ${HANDOFF_KEY_ENV} for `vllm serve` (the front end's key), or "
            "name a key file in kv_connector_extra_config.handoff_key_file"
        )
    return secret.get_secret_value().encode()
