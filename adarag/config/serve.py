"""The OpenAI-compatible HTTP server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

    @field_validator("documents_directory", mode="before")
    @classmethod
    def _check_documents_directory(cls, value: Any) -> Any:
        return _check_path(value, "documents_directory")
