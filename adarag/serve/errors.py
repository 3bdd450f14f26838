"""Errors of the HTTP server, in OpenAI's format: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request answered with an HTTP error status and an OpenAI-style error body.

    Args:
        status: The HTTP status.
        message: What went wrong and how to fix it.
        error_type: OpenAI's ``type`` (``invalid_request_error``, ``server_error``, ...).
        code: A short machine-readable code, or None.
        param: The request field at fault, or None.
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid_request(message: str, param: str | None = None) -> APIError:
    """400: the body names a bad field or value."""
    return APIError(400, message, error_type="invalid_request_error", param=param, code="invalid")


def model_not_found(model_id: str, served: str) -> APIError:
    """404: ``GET /v1/models/{id}`` names a model the server does not list."""
    return APIError(
        404,
        f"the model {model_id!r} does not exist here: this server serves one model, {served!r} "
        "(chat and completion requests naming any model get its answers)",
        error_type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def unauthorized() -> APIError:
    """401: the API key is missing or wrong."""
    return APIError(
        401,
        "invalid or missing API key; send it as 'Authorization: Bearer KEY' (the key the server "
        "was started with, from its API key environment variable)",
        error_type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def internal_error(err: BaseException) -> APIError:
    """500: a failure the server did not expect (named by its type; the log has the rest)."""
    return APIError(500, f"internal error: {type(err).__name__}", error_type="server_error")


def payload_too_large(
    limit_bytes: int, size: str, setting: str = "serve.max_request_body_bytes"
) -> APIError:
    """413: the body is over ``setting`` (``serve.max_request_body_bytes`` by default)."""
    return APIError(
        413,
        f"the request body is {size}, over the server's limit of {limit_bytes} bytes "
        f"({setting}); send less or raise the limit",
        error_type="invalid_request_error",
        code="request_too_large",
    )


def headers_too_large(limit_bytes: int, size_bytes: int) -> APIError:
    """431: the request's headers are over ``serve.max_request_header_bytes``."""
    return APIError(
        431,
        f"the request headers are {size_bytes} bytes, over the server's limit of {limit_bytes} "
        "bytes (serve.max_request_header_bytes); send fewer or shorter headers",
        error_type="invalid_request_error",
        code="headers_too_large",
    )


def body_timeout(timeout_s: float) -> APIError:
    """408: the body did not arrive within ``serve.body_read_timeout_s``."""
    return APIError(
        408,
        f"the request body did not arrive within {timeout_s:g} s (serve.body_read_timeout_s); "
        "send it at once, with a Content-Length that matches it",
        error_type="invalid_request_error",
        code="request_timeout",
    )


def nested_too_deeply(limit: int) -> APIError:
    """400: the JSON body nests arrays and objects deeper than ``serve.max_json_depth``."""
    return invalid_request(
        f"the request body nests JSON arrays and objects more than {limit} deep "
        "(serve.max_json_depth); flatten it"
    )


def foreign_host(host: str) -> APIError:
    """403: the Host header names neither the server's address nor ``serve.allowed_hosts``."""
    return APIError(
        403,
        f"this server does not answer to the host name {host[:100]!r} (a page reaching it by "
        "DNS rebinding sends such a name); use the address it listens on, or add the name to "
        "serve.allowed_hosts (`adarag serve --allowed-host NAME`)",
        error_type="invalid_request_error",
        code="host_not_allowed",
    )


def foreign_origin(origin: str) -> APIError:
    """403: a web page of another origin sent the request."""
    return APIError(
        403,
        f"requests from web pages of {origin[:200]!r} are refused: only the server's own pages "
        "and the origins in serve.allowed_origins (`adarag serve --allowed-origin URL`) may "
        "call it",
        error_type="invalid_request_error",
        code="origin_not_allowed",
    )


def unsupported_media_type(content_type: str, expected: str) -> APIError:
    """415: the body's Content-Type is not one the route reads (the connection closes unread)."""
    return APIError(
        415,
        f"the request body's Content-Type is {content_type[:100] or '(none)'!r}; send it as "
        f"{expected}",
        error_type="invalid_request_error",
        code="unsupported_media_type",
        headers={"Connection": "close"},
    )


class QueueFullError(APIError):
    """429: every active slot is busy and the wait queue is full."""

    def __init__(self, max_active: int, max_queued: int) -> None:
        super().__init__(
            429,
            f"the server is busy: {max_active} requests are running and {max_queued} are "
            "waiting (serve.max_queued_requests); retry later",
            error_type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )


class ShuttingDownError(APIError):
    """503: the server is shutting down and takes no more work."""

    def __init__(self) -> None:
        super().__init__(
            503,
            "the server is shutting down; retry against another instance or after it restarts",
            error_type="server_error",
            code="shutting_down",
            headers={"Retry-After": "5"},
        )


class RequestTimeoutError(APIError):
    """504: the request ran past ``serve.request_timeout_s`` and was cancelled."""

    def __init__(self, timeout_s: float, where: str) -> None:
        super().__init__(
            504,
            f"the request took longer than {timeout_s:g} s (serve.request_timeout_s) {where} "
            "and was cancelled; ask for fewer tokens or raise the timeout",
            error_type="timeout_error",
            code="request_timeout",
        )
