"""Routing errors (no such route, method not allowed) in OpenAI's error format.

Starlette answers them with ``{"detail": ...}``; OpenAI's clients read ``{"error": {...}}``
(``openai.NotFoundError`` carries its message), so the server answers every error alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from adarag.serve.errors import APIError


def add_http_error_handler(app: FastAPI) -> None:
    """Answer Starlette's HTTP errors (404, 405, ...) in OpenAI's format."""
    app.add_exception_handler(HTTPException, _on_http_error)  # type: ignore[arg-type]


async def _on_http_error(request: Request, err: HTTPException) -> JSONResponse:
    routes = route_names(request.app.routes)
    failure = describe_http_error(request.method, request.url.path, err, routes)
    return JSONResponse(failure.body(), status_code=failure.status, headers=failure.headers)


def route_names(routes: Sequence[BaseRoute]) -> list[str]:
    """``METHOD /path`` of every route the router holds (a mount or socket: its path)."""
    names = []
    for route in routes:
        path = getattr(route, "path", "")
        methods = sorted((getattr(route, "methods", None) or set()) - {"HEAD"})
        names += [f"{method} {path}" for method in methods] or [path]
    return names


def describe_http_error(
    method: str, path: str, err: HTTPException, routes: Sequence[str] = ()
) -> APIError:
    """The OpenAI-style error for Starlette's ``err`` on ``method path``.

    Args:
        method: The request's method.
        path: The request's path.
        err: What Starlette raised.
        routes: Every route of the application (:func:`route_names`), listed in a 404.
    """
    headers = dict(err.headers or {})
    if err.status_code == 404:
        message = f"no route {method} {path}; the routes are {', '.join(routes)}"
        return APIError(404, message, error_type="invalid_request_error", code="not_found")
    if err.status_code == 405:
        allowed = headers.get("allow", headers.get("Allow", ""))
        message = f"{method} is not allowed on {path}; use {allowed or 'another method'}"
        return APIError(
            405,
            message,
            error_type="invalid_request_error",
            code="method_not_allowed",
            headers=headers,
        )
    return APIError(
        err.status_code,
        str(err.detail),
        error_type="invalid_request_error" if err.status_code < 500 else "server_error",
        headers=headers,
    )
