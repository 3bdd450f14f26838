"""``/v1/files``: documents added, listed and deleted over HTTP, in OpenAI's Files format.

OpenAI's client works as is (``client.files.create(file=..., purpose="assistants")``,
``files.list()``, ``files.retrieve(id)``, ``files.delete(id)``); a text can also be sent as JSON
(``{"filename": "notes.md", "text": "..."}``). A file object's ``status`` is ``uploaded``
while its chunks are embedded and warmed, ``processed`` once its KV is cached, ``error`` if that
failed; ``adarag.state`` says which step it is at. See :mod:`adarag.serve.uploads` (what an
upload must pass) and :mod:`adarag.serve.documents`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from adarag.serve.documents import DocumentInfo, DocumentLibrary
from adarag.serve.errors import APIError
from adarag.serve.uploads import Uploads


def files_router(uploads: Uploads | None, check_key: Callable[[Request], None]) -> APIRouter:
    """The ``/v1/files`` routes over ``uploads`` (None: the server has no knowledge base)."""
    library = uploads.library if uploads is not None else None
    router = APIRouter(prefix="/v1/files", dependencies=[Depends(check_key)])

    def documents() -> DocumentLibrary:
        if library is None:
            raise APIError(
                404,
                "this server answers from a retriever that is not a Chroma knowledge base, so "
                "documents cannot be added to it; serve a knowledge base (`adarag serve`)",
                error_type="invalid_request_error",
                code="no_knowledge_base",
            )
        return library

    @router.post("")
    async def add(request: Request) -> dict[str, Any]:
        documents()  # 404 without a knowledge base
        assert uploads is not None, "a library comes with its uploads"
        return (await uploads.add(request)).as_openai()

    @router.get("")
    async def listed() -> dict[str, Any]:
        found = await asyncio.to_thread(documents().documents)
        return {"object": "list", "data": [info.as_openai() for info in found], "has_more": False}

    @router.get("/{wanted_id}")
    async def retrieve(wanted_id: str) -> dict[str, Any]:
        return _found(await asyncio.to_thread(documents().find, wanted_id), wanted_id).as_openai()

    @router.delete("/{wanted_id}")
    async def delete(wanted_id: str) -> dict[str, Any]:
        info = _found(await asyncio.to_thread(documents().delete, wanted_id), wanted_id)
        return {"id": info.file_id, "object": "file", "deleted": True}

    return router


def _found(info: DocumentInfo | None, wanted_id: str) -> DocumentInfo:
    if info is None:
        raise APIError(
            404,
            f"there is no document {wanted_id!r}; GET /v1/files lists them",
            error_type="invalid_request_error",
            code="file_not_found",
            param="file_id",
        )
    return info
