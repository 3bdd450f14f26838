"""What a request must pass before a route sees it: the API key, then size, time and depth limits.

:class:`RequestLimits` is the application's outermost ASGI middleware. In order, it refuses:

1. headers over ``serve.max_request_header_bytes`` (431);
2. a missing or wrong API key, on every path but ``/health`` (401), before any of the body is
   read, so a client without the key cannot make the server read or parse anything;
3. a ``Content-Length`` over ``serve.max_request_body_bytes`` (``serve.max_upload_bytes`` for
   a document upload, ``POST /v1/files``) (413), before any of the body is read; then it reads
   the body, refusing it once more bytes than that have arrived (413) or when it has not all
   arrived within ``serve.body_read_timeout_s`` (408). An upload's body is not read here but
   passed on as it arrives, under the same two limits, so it goes to disk, never whole into
   memory (:mod:`adarag.serve.uploads`);
4. JSON nested deeper than ``serve.max_json_depth`` (400), counted without parsing (a
   ``multipart/form-data`` upload is not JSON and is not counted).

A refusal that leaves part of the body unread closes the connection, so the rest of the body is
not read either. A request that passes reaches the application with its body read, and its
handling is cancelled when the client hangs up before the response starts
(:func:`~adarag.serve.disconnect.call_until_disconnect`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re

import numpy as np
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adarag.config import ServeConfig
from adarag.serve.disconnect import call_until_disconnect
from adarag.serve.errors import (
    APIError,
    body_timeout,
    headers_too_large,
    nested_too_deeply,
    payload_too_large,
    unauthorized,
)

OPEN_PATHS = frozenset({"/health", "/", "/chat.js", "/chat.css"})
"""Paths served without the API key: the health check and the chat page (which asks for it)."""
UPLOAD_PATH = "/v1/files"
"""Documents are posted here; their bodies may reach ``serve.max_upload_bytes``."""

# A JSON string, its closing quote optional: one pass, never a rescan (linear on any input).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class _ClientGone(Exception):
    """The client hung up before its body had all arrived."""


class RequestLimits:
    """ASGI middleware checking the key and the limits above before the application runs.

    Args:
        app: The application.
        config: The limits (``serve.max_request_*``, ``max_json_depth``, ``body_read_timeout_s``).
        api_key: The key clients must send as ``Authorization: Bearer KEY``; None: no key.
    """

    def __init__(self, app: ASGIApp, config: ServeConfig, api_key: str | None) -> None:
        self.app = app
        self.config = config
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request, read its body, then hand both to the application."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_headers(scope)
            if scope["path"] == UPLOAD_PATH and scope["method"] == "POST":
                self._check_length(scope, *self._limit(scope))
                streamed = _StreamedBody(receive, self.config)
                await call_until_disconnect(
                    self.app, scope, streamed.receive, send, receive, streamed.done
                )
                return
            body = await self._read_body(scope, receive)
            content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
            if not content_type.lower().startswith(b"multipart/form-data"):
                check_json_depth(body, self.config.max_json_depth)
        except _ClientGone:
            return
        except APIError as err:
            await send_refusal(send, err)
            return
        await call_until_disconnect(self.app, scope, _replay(body, receive), send, receive)

    def _check_headers(self, scope: Scope) -> None:
        size_bytes = len(scope.get("raw_path") or b"") + len(scope.get("query_string", b""))
        size_bytes += sum(len(name) + len(value) for name, value in scope["headers"])
        if size_bytes > self.config.max_request_header_bytes:
            raise headers_too_large(self.config.max_request_header_bytes, size_bytes)
        if self._expected is None or scope["path"] in OPEN_PATHS:
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if not hmac.compare_digest(given, self._expected):
            raise unauthorized()

    def _limit(self, scope: Scope) -> tuple[int, str]:
        if scope["path"] == UPLOAD_PATH and scope["method"] == "POST":
            return self.config.max_upload_bytes, "serve.max_upload_bytes"
        return self.config.max_request_body_bytes, "serve.max_request_body_bytes"

    @staticmethod
    def _check_length(scope: Scope, limit: int, setting: str) -> None:
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise payload_too_large(limit, f"{int(declared)} bytes (its Content-Length)", setting)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit, setting = self._limit(scope)
        self._check_length(scope, limit, setting)
        parts: list[bytes] = []
        size_bytes = 0
        try:
            async with asyncio.timeout(self.config.body_read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone()
                    part = message.get("body", b"")
                    size_bytes += len(part)
                    if size_bytes > limit:
                        raise payload_too_large(limit, f"over {limit} bytes", setting)
                    parts.append(part)
                    if not message.get("more_body", False):
                        return b"".join(parts)
        except TimeoutError:
            raise body_timeout(self.config.body_read_timeout_s) from None


def check_json_depth(body: bytes, limit: int) -> None:
    """Refuse ``body`` when its arrays and objects nest more than ``limit`` deep.

    The brackets outside strings are counted in linear time, without parsing: a body that is
    not JSON passes (or not) here and is refused by the parser.

    Raises:
        APIError: 400, the body nests too deeply.
    """
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.ones(len(codes), dtype=np.int32)
    steps[(codes == ord("]")) | (codes == ord("}"))] = -1
    if int(np.cumsum(steps, dtype=np.int32).max()) > limit:
        raise nested_too_deeply(limit)


class _StreamedBody:
    """An upload's body passed on as it arrives, held to its size and time limits.

    ``done`` is set once the body has all arrived (or the client hung up), when a hang-up can
    next be watched for. A limit passed raises its :class:`APIError` (with ``Connection:
    close``, the rest of the body unread) in the application, which answers it.
    """

    def __init__(self, receive: Receive, config: ServeConfig) -> None:
        self._receive = receive
        self._limit = config.max_upload_bytes
        self._timeout_s = config.body_read_timeout_s
        self._deadline: float | None = None
        self._size_bytes = 0
        self.done = asyncio.Event()

    async def receive(self) -> Message:
        """The next part of the body (the client's hang-up once it has all arrived)."""
        if self.done.is_set():
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._timeout_s
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise _closing(body_timeout(self._timeout_s)) from None
        self._size_bytes += len(message.get("body", b""))
        if self._size_bytes > self._limit:
            size = f"over {self._limit} bytes"
            raise _closing(payload_too_large(self._limit, size, "serve.max_upload_bytes"))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.done.set()
        return message


def _closing(err: APIError) -> APIError:
    err.headers["Connection"] = "close"
    return err


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` giving the body read, then what the client sends next (its hang-up)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def send_refusal(send: Send, err: APIError) -> None:
    """Answer ``err`` as JSON and close the connection (the body may be left unread)."""
    content = json.dumps(err.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        (b"connection", b"close"),
    ]
    headers.extend((name.lower().encode(), value.encode()) for name, value in err.headers.items())
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
