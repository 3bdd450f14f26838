"""The shared tier: chunk-KV entries on a Redis-protocol server (Redis, Valkey), under local disk.

Every process whose store names the same server, model namespace and key prefix shares the
entries. Keys on the server start with ``<prefix>:<entry format>:<model namespace>:``, then:

- ``e:<entry id>`` holds an entry's bytes, exactly what the disk tier writes to a file
  (:mod:`adarag.cache.entry_format`: safetensors with its keys, namespace and checksum);
- ``k:<cache key>`` holds the id of the entry that cache key points at.

The cache keys are the local tiers' own (content hashes bound to the model and the system
prefix), so an entry is only ever found by prompts it was computed for.

**Writes** are one MULTI/EXEC transaction of ``SET NX`` (with the TTL) on the entry, then on each
of its keys: the first writer of an entry or a key wins, writing it again changes nothing, and a
key becomes visible only with a whole entry behind it (a single ``SET`` of a value is atomic).

**Reads** fetch at most ``remote_max_entry_bytes`` of an entry (a bounded ``GETRANGE``) and
verify the bytes (checksum, signature when the store has a signing key, format, namespace, keys,
the model's layout and positions) before they are served. An entry failing a check, larger than
the bound, or of another Redis type is deleted from the server and reported as a miss, so the
chunk is recomputed; a key whose entry is gone (expired, evicted) is deleted too. An entry
signed under another key than the store's is a miss that leaves the entry in place (it may be
another process's, sharing the server with another key).

**Failures.** A connection error, timeout or refused command marks the server down: one warning
names it, and for ``remote_retry_s`` every call answers as a miss without touching the network
(the local tiers serve alone); then it is tried again. No server problem reaches the caller.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from adarag.cache.codec import KVCodec, StoredKV
from adarag.cache.entry_format import FORMAT, RejectedEntry, decode_entry
from adarag.config import StoreConfig, redact_url
from adarag.errors import MissingDependencyError

logger = logging.getLogger(__name__)

_ENTRY_ID = re.compile(rb"[0-9a-f]{32}")
_T = TypeVar("_T")


class _Refused(enum.Enum):
    """The server refused a command for its key's value (not a server failure)."""

    REFUSED = enum.auto()


_REFUSED = _Refused.REFUSED


@dataclass(frozen=True)
class RemoteHit:
    """An entry read from the server and verified.

    Attributes:
        keys: Every key the entry answers to.
        stored: Its KV, in the storage format.
        num_bytes: Bytes moved from the server (the entry's size there).
    """

    keys: tuple[str, ...]
    stored: StoredKV
    num_bytes: int


@dataclass
class RemoteStats:
    """Events of the shared tier since the store opened."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    dropped: int = 0  # entries that failed a check, deleted from the server
    failures: int = 0  # requests that failed (server unreachable, timed out, refused)
    signature_failures: int = 0  # signature missing or wrong (dropped), or another key's (kept)
    oversized: int = 0  # of the dropped: larger than remote_max_entry_bytes


class RemoteTier:
    """Chunk-KV entry bytes on a Redis-protocol server, shared by processes.

    Args:
        config: ``remote_url`` (set) and the other ``remote_*`` settings.
        model_fingerprint: The model namespace; part of every key on the server.
        codec: The storage format and model layout every entry must have.
        signing_key: When given, entries are signed with it, and one whose signature does not
            verify is refused: dropped, unless another key signed it.

    Raises:
        MissingDependencyError: The ``redis`` package is not installed.
    """

    def __init__(
        self,
        config: StoreConfig,
        model_fingerprint: str,
        codec: KVCodec,
        signing_key: bytes | None = None,
    ) -> None:
        assert config.remote_url is not None, "a remote tier needs remote_url"
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as err:
            raise MissingDependencyError("redis", "remote") from err
        self.config = config
        self.model_fingerprint = model_fingerprint
        self.codec = codec
        self.signing_key = signing_key
        self.max_entry_bytes = config.remote_max_entry_bytes
        self.url = redact_url(config.remote_url)
        self.prefix = f"{config.remote_key_prefix}:{FORMAT}:{model_fingerprint}:"
        self.stats = RemoteStats()
        options: dict[str, Any] = {
            "socket_timeout": config.remote_timeout_s,
            "socket_connect_timeout": config.remote_timeout_s,
            # one immediate retry: a pooled connection the server closed is reopened once
            "retry": Retry(NoBackoff(), 1),
        }
        if config.remote_username is not None:
            options["username"] = config.remote_username
        if config.remote_password is not None:
            options["password"] = config.remote_password.get_secret_value()
        if config.remote_tls_ca_file is not None:
            options["ssl_ca_certs"] = str(config.remote_tls_ca_file)
        if config.remote_tls_cert_file is not None and config.remote_tls_key_file is not None:
            options["ssl_certfile"] = str(config.remote_tls_cert_file)
            options["ssl_keyfile"] = str(config.remote_tls_key_file)
        self._client = redis.Redis.from_url(config.remote_url, **options)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._refusal: type[BaseException] = redis.ResponseError  # e.g. WRONGTYPE, this exactly
        self._lock = threading.Lock()
        self._down_until: float | None = None  # None: up (as far as we know)
        self._call(self._client.ping)  # an unreachable server is reported now, once

    def entry_name(self, entry_id: str) -> str:
        """The server key holding an entry's bytes."""
        return f"{self.prefix}e:{entry_id}"

    def key_name(self, key: str) -> str:
        """The server key holding the id of the entry a cache key points at."""
        return f"{self.prefix}k:{key}"

    @property
    def is_available(self) -> bool:
        """Whether requests go to the server now (False while it is marked down)."""
        with self._lock:
            return self._down_until is None or time.monotonic() >= self._down_until

    def fetch(self, key: str) -> RemoteHit | None:
        """The verified entry ``key`` points at, or None (a miss, a bad entry, or server down)."""
        if not self.is_available:
            return None
        pointer = self._call(self._client.get, self.key_name(key))
        if pointer is _REFUSED:
            self._drop(None, key, "its key holds a value of another type")
            return None
        if not isinstance(pointer, bytes):
            self._count(misses=1)
            return None
        if not _ENTRY_ID.fullmatch(pointer):
            self._drop(None, key, "its key holds no entry id")
            return None
        entry_id = pointer.decode()
        # at most one byte past the bound: a larger value is never moved whole
        data = self._call(self._client.getrange, self.entry_name(entry_id), 0, self.max_entry_bytes)
        if data is _REFUSED:
            self._drop(entry_id, key, "its entry holds a value of another type")
            return None
        if not isinstance(data, bytes) or not data:
            if self.is_available:  # expired or evicted: the key points at nothing
                self._call(self._client.delete, self.key_name(key))
            self._count(misses=1)
            return None
        if len(data) > self.max_entry_bytes:
            self._count(oversized=1)
            self._drop(entry_id, key, f"it is larger than {self.max_entry_bytes} bytes")
            return None
        try:
            keys, stored = decode_entry(
                data, entry_id, self.model_fingerprint, self.codec, self.signing_key
            )
        except RejectedEntry as rejected:
            if rejected.unsigned:
                self._count(signature_failures=1)
            if rejected.other_key:  # warned once, then at debug level
                log = logger.warning if self.snapshot().signature_failures == 1 else logger.debug
                log("not serving entry %s of %s: %s", entry_id, self.url, rejected)
                self._count(misses=1)
            else:
                self._drop(entry_id, key, str(rejected))
            return None
        if key not in keys:
            self._drop(None, key, f"it points at entry {entry_id}, which does not claim it")
            return None
        self._count(hits=1, read_bytes=len(data))
        return RemoteHit(keys, stored, len(data))

    def exists(self, key: str) -> bool:
        """Whether the server has ``key`` (False while it is marked down)."""
        if not self.is_available:
            return False
        return bool(self._call(self._client.exists, self.key_name(key)))

    def write(self, entry_id: str, keys: tuple[str, ...], data: bytes) -> bool:
        """Store an entry's bytes under ``keys`` unless they are there; whether it was sent."""
        if not self.is_available or len(data) > self.max_entry_bytes:
            return False
        ttl = self.config.remote_ttl_seconds
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self.entry_name(entry_id), data, nx=True, ex=ttl)
        for key in keys:
            pipe.set(self.key_name(key), entry_id, nx=True, ex=ttl)
        replies = self._call(pipe.execute)
        if replies is None or replies is _REFUSED:
            return False
        if replies[0]:  # None when the entry was there already
            self._count(writes=1, write_bytes=len(data))
        return True

    def forget(self, key: str) -> None:
        """Delete ``key`` from the server (its entry expires on its own)."""
        if self.is_available:
            self._call(self._client.delete, self.key_name(key))

    def snapshot(self) -> RemoteStats:
        """A copy of the statistics."""
        with self._lock:
            return RemoteStats(**vars(self.stats))

    def close(self) -> None:
        """Close the connections to the server."""
        self._client.close()

    # --- internals

    def _call(self, request: Callable[..., _T], *args: Any) -> _T | None | _Refused:
        """``request(*args)``, or None once the server failed it (marked down, warned once).

        A plain refusal of the command for its key (a value of another type: ``WRONGTYPE``) is
        :data:`_REFUSED`: the key is bad, the server is not down.
        """
        try:
            result = request(*args)
        except self._errors as err:
            if type(err) is self._refusal:
                return _REFUSED
            self._mark_down(err)
            return None
        if self._down_until is not None:
            with self._lock:
                was_down, self._down_until = self._down_until is not None, None
            if was_down:
                logger.info("the shared KV tier at %s is reachable again", self.url)
        return result

    def _mark_down(self, err: BaseException) -> None:
        with self._lock:
            was_up = self._down_until is None
            self._down_until = time.monotonic() + self.config.remote_retry_s
            self.stats.failures += 1
        if was_up:
            logger.warning(
                "the shared KV tier at %s failed (%s: %s); serving from the local tiers only, "
                "trying it again in %g s",
                self.url,
                type(err).__name__,
                err,
                self.config.remote_retry_s,
            )

    def _drop(self, entry_id: str | None, key: str, reason: str) -> None:
        """Delete a bad entry (when given) and ``key`` from the server, and say why."""
        logger.warning(
            "dropping %s from the shared KV tier at %s: %s; it will be recomputed",
            f"entry {entry_id}" if entry_id else f"key {key}",
            self.url,
            reason,
        )
        names = [self.key_name(key)] + ([self.entry_name(entry_id)] if entry_id else [])
        self._call(self._client.delete, *names)
        self._count(misses=1, dropped=1)

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
