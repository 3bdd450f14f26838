"""The OpenAI-compatible HTTP server."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from adarag.config.base import _check_path, _Frozen


class ServeConfig(_Frozen):
    """The OpenAI-compatible HTTP server of ``adarag serve``."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Interface to listen on ('0.0.0.0' for every interface).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_active_requests: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Requests the engine works on at once; their prefill and decode steps "
        "interleave on the one engine.",
    )
    max_queued_requests: int = Field(
        default=32,
        ge=0,
        le=65536,
        description="Requests that may wait for an active slot; one more is refused with 429.",
    )
    request_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        le=86400.0,
        description="Seconds a request may take from arrival (queue wait included) to its last "
        "token; past it the request is cancelled with 504 (or an error event mid-stream).",
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description="On SIGTERM/SIGINT, seconds in-flight requests may take to finish before "
        "they are cancelled; queued requests get 503 at once. The KV cache is flushed last.",
    )
    api_key_env: str = Field(
        default="ADARAG_API_KEY",
        min_length=1,
        description="Environment variable holding the API key clients must send as "
        "'Authorization: Bearer KEY'; unset or empty: no key is required.",
    )
    model_name: str | None = Field(
        default=None,
        min_length=1,
        description="Model id listed by /v1/models and put in responses; None: the checkpoint "
        "name.",
    )
    default_max_tokens: int = Field(
        default=256, ge=1, le=8192, description="Answer length when a request sets none."
    )
    history_turns: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Earlier (user, assistant) turns of a chat request carried into retrieval "
        "and the prompt, as `adarag chat --history-turns` does.",
    )
    max_request_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Largest request body read; a larger one is refused with 413 before it is "
        "read (from its Content-Length, or once that many bytes have arrived).",
    )
    max_request_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest total size of a request's header names and values; more is "
        "refused with 431.",
    )
    max_json_depth: int = Field(
        default=64,
        ge=4,
        le=1000,
        description="Deepest nesting of JSON arrays and objects in a request body, checked "
        "before the body is parsed; deeper is refused with 400.",
    )
    header_read_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        le=3600.0,
        description="Seconds a connection may take to send a request's head (request line and "
        "headers) from when it opens or its previous response ends; past it the server answers "
        "408 and closes it, so clients sending headers slowly cannot hold connections.",
    )
    max_connections: int = Field(
        default=512,
        ge=1,
        le=65536,
        description="Open client connections at most; one more is closed as soon as it is "
        "accepted (keep it under the process's open-file limit).",
    )
    max_connections_per_address: int = Field(
        default=32,
        ge=1,
        le=65536,
        description="Open connections from one client IP address at most; one more is closed as "
        "soon as it is accepted, so one client cannot hold every connection. Behind a reverse "
        "proxy every client shares the proxy's address: raise it to max_connections there and "
        "cap connections per client at the proxy.",
    )
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Host names (the Host header, without the port) the server answers to "
        "besides the address it listens on; loopback names (localhost, 127.0.0.1, ::1) are "
        "always accepted on a loopback address, and IP addresses and this machine's name on "
        "0.0.0.0 or ::. Another Host is refused with 403, so a web page cannot reach the server "
        "by DNS rebinding. '*' accepts any Host (only behind a proxy that checks it).",
    )
    allowed_origins: tuple[str, ...] = Field(
        default=(),
        description="Web origins ('https://app.example.com', scheme://host[:port]) whose pages "
        "may call the server and read its answers (CORS) besides its own (the chat page); a "
        "request from any other page (its Origin header) is refused with 403, so a page on "
        "another site cannot add documents or query the knowledge base.",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="Seconds a request's body may take to arrive once its headers have; past "
        "it the request is refused with 408 and the connection closed.",
    )
    documents_directory: Path | None = Field(
        default=None,
        description="Where documents added over HTTP (POST /v1/files) are kept, one file per "
        "name, each ingested into the knowledge base from there; None: <home>/documents.",
    )
    max_upload_bytes: int = Field(
        default=64 * 1024**2,
        ge=1024,
        le=4 * 1024**3,
        description="Largest request body POST /v1/files reads (a document upload); a larger "
        "one is refused with 413 before it is read. Other routes keep max_request_body_bytes.",
    )

    max_concurrent_uploads: int = Field(
        default=2,
        ge=1,
        le=256,
        description="Documents POST /v1/files receives and parses at once; more wait for a free "
        "slot (each upload is written to disk as it arrives and parsed in a worker process).",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        hosts = tuple(host.strip().lower().strip("[]") for host in value)
        bad = [host for host in hosts if not host or "/" in host or " " in host]
        if bad:
            raise ValueError(
                f"allowed_hosts holds {bad!r}; give host names or addresses such as "
                "'kb.example.com' or '10.0.0.5', without a scheme, path or port"
            )
        return hosts

    @field_validator("allowed_origins")
    @classmethod
    def _check_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_origin(origin) for origin in value)

    @field_validator("documents_directory", mode="before")
    @classmethod
    def _check_documents_directory(cls, value: Any) -> Any:
        return _check_path(value, "documents_directory")


def _origin(given: str) -> str:
    """``scheme://host[:port]`` of an allowed origin, lower-cased, default port dropped."""
    parts = urlsplit(given.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ValueError(
            f"allowed_origins holds {given!r}; give origins as scheme://host[:port], such as "
            "'https://app.example.com' or 'http://localhost:3000'"
        )
    return normal_origin(parts.scheme, parts.hostname, parts.port)


def normal_origin(scheme: str, host: str, port: int | None) -> str:
    """An origin as compared: lower case, an IPv6 address in brackets, no default port."""
    host = host.lower()
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    default_port = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" if port in (None, default_port) else f"{scheme}://{host}:{port}"
