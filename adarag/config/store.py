"""Where chunk KV lives: memory and disk tiers, the shared server, the signing key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from adarag.config.base import _Frozen
from adarag.config.secrets import check_key, key_bytes, secret_from_env

SIGNING_KEY_ENV = "ADARAG_KV_SIGNING_KEY"
"""Environment variable read for ``cache.store.signing_key`` when the setting is not given."""


class StoreConfig(_Frozen):
    """Where chunk KV lives and how much of it."""

    directory: Path | None = Field(
        default=None, description="Disk tier directory; None uses <home>/kv/<model fingerprint>."
    )
    memory_capacity_bytes: int = Field(
        default=4 * 1024**3, ge=0, description="Byte cap of the memory tier."
    )
    disk_capacity_bytes: int = Field(
        default=16 * 1024**3, ge=0, description="Byte cap of the disk tier; 0 disables it."
    )
    storage_dtype: Literal["float32", "float16", "bfloat16", "int8"] = Field(
        default="bfloat16",
        description=(
            "Format chunk KV is stored in: bfloat16 (half of float32's bytes, float32's range; "
            "no loss measured on the fidelity benchmark), float32 (hard hits bit-exact), "
            "float16, or 'int8' (KIVI-style: keys per channel, values per token, ~3.9x smaller "
            "than float32)."
        ),
    )
    eviction_policy: Literal["lru", "lfu"] = Field(
        default="lfu",
        description="Which entry leaves a full tier first: 'lfu' (the default: fewest hits, least "
        "recent among equals) or 'lru' (least recent). Entries on probation (see admission) "
        "always go first.",
    )
    admission: Literal["always", "frequency"] = Field(
        default="frequency",
        description="Which chunk KV written back after a prompt lasts. 'frequency' (the default): "
        "a chunk's KV lasts once the chunk (or its prefix) has been written back "
        "admission_threshold times, counted in an aging count-min sketch; until then it is kept "
        "on probation (readable by the request's next step, evicted first, not spilled to "
        "disk), so novel queries do not evict the popular chunks' KV. 'always': every "
        "write-back lasts. Over 300 novel queries with Zipf-popular chunks "
        "(benchmarks/results/sustained-traffic/sustained_traffic.md), 'frequency' with 'lfu' "
        "eviction served 47.5% of chunk lookups from the cache (47.0% in the last 50 queries) "
        "against 38.3% (36.5%) for 'always' with 'lru' and 46.3% (45.0%) with 'lfu', with 5x "
        "fewer disk writes.",
    )
    admission_threshold: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="Write-backs of a chunk or prefix, the current one included, before its KV "
        "lasts ('frequency' admission); 1 behaves as 'always'.",
    )
    remote_url: str | None = Field(
        default=None,
        description="A third tier under memory and disk, shared by processes and machines: a "
        "Redis-protocol server (Redis, Valkey) as 'redis://host:port/db', 'rediss://host:port/db' "
        "(TLS) or 'unix:///path/to.sock?db=0'; None: the local tiers only. Needs the `remote` "
        "extra. A local miss is looked up there before it is recomputed; an unreachable server "
        "leaves the local tiers serving alone.",
    )
    remote_username: str | None = Field(
        default=None, description="User name for the server's AUTH (ACL users); None: none."
    )
    remote_password: SecretStr | None = Field(
        default=None, description="Password for the server's AUTH; None: none (or the URL's)."
    )
    remote_tls_ca_file: Path | None = Field(
        default=None,
        description="CA bundle that verifies the server's certificate (rediss:// only); None: "
        "the system's CAs.",
    )
    remote_tls_cert_file: Path | None = Field(
        default=None, description="Client certificate for mutual TLS (rediss:// only)."
    )
    remote_tls_key_file: Path | None = Field(
        default=None, description="Private key of remote_tls_cert_file (rediss:// only)."
    )
    remote_ttl_seconds: int | None = Field(
        default=7 * 24 * 3600,
        ge=1,
        description="Seconds an entry lives on the server after it is written; None: until the "
        "server evicts it. The server's own maxmemory (with maxmemory-policy allkeys-lru) caps "
        "its size.",
    )
    remote_timeout_s: float = Field(
        default=2.0, gt=0.0, le=60.0, description="Connect and reply timeout of each request."
    )
    remote_retry_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description="After the server fails a request, seconds the local tiers serve alone "
        "before it is tried again.",
    )
    remote_max_entry_bytes: int = Field(
        default=64 * 1024**2,
        ge=1024,
        description="Largest entry read from or written to the shared tier, in bytes: a larger "
        "value there is dropped after reading at most this many bytes of it (a bounded read), "
        "never fetched whole.",
    )
    remote_key_prefix: str = Field(
        default="adarag",
        min_length=1,
        max_length=64,
        description="First part of every key on the server (the entry format and the model "
        "namespace follow); deployments sharing one server database may each take their own.",
    )

    signing_key: SecretStr | None = Field(
        default_factory=lambda: secret_from_env(SIGNING_KEY_ENV),
        description="Secret (at least 16 characters) with which every stored chunk-KV entry, on "
        "disk and in the shared tier, carries an HMAC-SHA256 over its metadata and tensors; a "
        "store with the key rejects, deletes and recomputes any entry whose signature is "
        "missing or wrong (counted in its stats as signature_failures), so whoever can write "
        "the KV directory or the shared server cannot plant KV that is served. Default: the "
        f"${SIGNING_KEY_ENV} environment variable, else none (or signing_key_file). Without a "
        "key every entry passing its checksum is served: the store trusts everyone who can "
        "write to its directory or shared server. Never logged.",
    )
    signing_key_file: Path | None = Field(
        default=None,
        description="File holding signing_key (its first line), read when the store opens; "
        "instead of signing_key.",
    )

    @field_validator("remote_url")
    @classmethod
    def _check_remote_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        reason = _remote_url_problem(value)
        if reason is not None:
            shown = redact_url(value)
            raise ValueError(
                f"remote_url must be a Redis URL such as 'redis://localhost:6379/0', "
                f"'rediss://host:6380/0' or 'unix:///run/valkey.sock?db=0' ({reason}), got "
                f"{shown!r}"
            )
        return value

    @field_validator("remote_key_prefix")
    @classmethod
    def _check_remote_key_prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(
                f"remote_key_prefix must be letters, digits, '.', '_' or '-', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_remote_tls(self) -> StoreConfig:
        tls_files = [
            name
            for name in ("remote_tls_ca_file", "remote_tls_cert_file", "remote_tls_key_file")
            if getattr(self, name) is not None
        ]
        if tls_files and not (self.remote_url or "").startswith("rediss://"):
            raise ValueError(
                f"{', '.join(tls_files)} apply to TLS connections only; make remote_url a "
                "rediss:// URL or drop them"
            )
        if (self.remote_tls_key_file is None) != (self.remote_tls_cert_file is None):
            raise ValueError("remote_tls_cert_file and remote_tls_key_file go together; set both")
        if self.signing_key is not None and self.signing_key_file is not None:
            raise ValueError(
                "signing_key and signing_key_file both given (signing_key may come from "
                f"${SIGNING_KEY_ENV}); keep one"
            )
        if self.signing_key is not None:
            _check_signing_key(self.signing_key.get_secret_value(), "signing_key")
        return self

    def signing_key_bytes(self) -> bytes | None:
        """The signing key (read from ``signing_key_file`` when that is set), or None.

        Raises:
            ConfigError: The file cannot be read, is open to other users, or its key is too
                short.
        """
        return key_bytes(self.signing_key, self.signing_key_file, "cache.store.signing_key_file")


def _check_signing_key(key: str, what: str) -> None:
    """Refuse a key too short to resist guessing, or one that is a masked placeholder."""
    check_key(key, what)


def _remote_url_problem(url: str) -> str | None:
    """Why ``url`` is not a Redis URL the client can open, or None when it is."""
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as err:
        if "@" not in url and "?" not in url:
            return str(err)  # no password to quote
        # the parser's message may quote part of a password: it is not repeated
        return (
            "its host or port cannot be read (a password holding '/', '?' or '#' must be "
            "percent-encoded, or given as remote_password)"
        )
    if parsed.scheme not in ("redis", "rediss", "unix"):
        return f"unknown scheme {parsed.scheme + ':' if parsed.scheme else 'none'}"
    if parsed.scheme == "unix":
        return None if parsed.path else "no socket path"
    if not parsed.hostname:
        return "no host"
    if port == 0:
        return "port 0"
    database = parsed.path.strip("/")
    if database and not database.isdigit():
        return "the database after the host is not a number"
    return None


_SECRET_QUERY_PARAMETER = re.compile(
    r"(?i)((?:^|[&;])[^=&;]*(?:pass|pwd|secret|token|auth)[^=&;]*=)[^&;]*"
)


def redact_url(url: str) -> str:
    """``url`` without its secrets, for messages and logs.

    Whatever stands before the last ``@`` is hidden (the user name is kept when it is plainly
    one, before a ``:``), whatever the password's characters; so is the value of every query
    parameter whose name says password, secret, token or auth, up to the next ``&``.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    hidden = ""
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        plain = colon and user and not any(mark in user for mark in "/?#")
        hidden = f"{user}:***@" if plain else "***@"
    rest, question, query = rest.partition("?")
    if question:
        query = _SECRET_QUERY_PARAMETER.sub(r"\1***", query)
    return f"{scheme}{separator}{hidden}{rest}{question}{query}"
