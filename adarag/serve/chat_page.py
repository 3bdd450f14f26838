"""The chat page at ``/``: static HTML, CSS and JavaScript, with no dependency.

The page is served without the API key (it holds no data); it asks for the key and sends it
with every API call it makes. Its content security policy lets it load only its own files and
call only this server.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

PAGE_FILES = {"/": "chat.html", "/chat.js": "chat.js", "/chat.css": "chat.css"}
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def chat_page_router() -> APIRouter:
    """The routes of the page's three files (read once, from the package)."""
    router = APIRouter(include_in_schema=False)
    static = resources.files("adarag.serve").joinpath("static")
    for path, name in PAGE_FILES.items():
        content = static.joinpath(name).read_bytes()
        media_type = MEDIA_TYPES[name[name.rindex(".") :]] + "; charset=utf-8"

        def serve(content: bytes = content, media_type: str = media_type) -> Response:
            return Response(content, media_type=media_type, headers=HEADERS)

        router.add_api_route(path, serve, methods=["GET"])
    return router
