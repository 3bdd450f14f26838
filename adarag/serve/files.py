"""``/v1/files``: documents added, listed and deleted over HTTP, in OpenAI's Files format.

OpenAI's client works as is (``client.files.create(file=..., purpose="assistants")``,
``files.list()`` with its ``limit``, ``after``, ``order`` and ``purpose``, ``files.retrieve(id)``,
``files.content(id)``, ``files.delete(id)``); a text can also be sent as JSON
(``{"filename": "notes.md", "text": "..."}``). A file object's ``status`` is ``uploaded``
while its chunks are embedded and warmed, ``processed`` once its KV is cached, ``error`` if that
failed; ``adarag.state`` says which step it is at. See :mod:`adarag.serve.uploads` (what an
upload must pass) and :mod:`adarag.serve.documents`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from adarag.serve.documents import DocumentInfo, DocumentLibrary
from adarag.serve.errors import APIError
from adarag.serve.file_pages import FilePageQuery, file_page
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
    async def listed(
        purpose: str | None = None,
        order: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> dict[str, Any]:
        query = FilePageQuery.of(purpose, order, limit, after)
        return file_page(await asyncio.to_thread(documents().documents), query)

    @router.get("/{wanted_id}")
    async def retrieve(wanted_id: str) -> dict[str, Any]:
        return _found(await asyncio.to_thread(documents().find, wanted_id), wanted_id).as_openai()

    @router.get("/{wanted_id}/content")
    async def content(wanted_id: str) -> StreamingResponse:
        library = documents()
        info = _found(await asyncio.to_thread(library.find, wanted_id), wanted_id)
        path = library.kept_file(info)
        if path is None:
            raise APIError(
                404,
                f"{info.filename} ({wanted_id}) was ingested from a file on the server, not sent "
                "to /v1/files, so the server does not serve its content; read it where it was "
                "ingested from",
                error_type="invalid_request_error",
                code="file_content_not_kept",
                param="file_id",
            )
        opened = await asyncio.to_thread(_opened, path)
        if opened is None:  # deleted since it was found
            raise _not_found(wanted_id)
        handle, num_bytes = opened
        headers = {"Content-Length": str(num_bytes)}
        return StreamingResponse(
            _blocks(handle), media_type="application/octet-stream", headers=headers
        )

    @router.delete("/{wanted_id}")
    async def delete(wanted_id: str) -> dict[str, Any]:
        info = _found(await asyncio.to_thread(documents().delete, wanted_id), wanted_id)
        return {"id": info.file_id, "object": "file", "deleted": True}

    return router


def _opened(path: Path) -> tuple[BinaryIO, int] | None:
    """The file open for reading and its size, or None when it is gone."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    return handle, os.fstat(handle.fileno()).st_size


def _blocks(handle: BinaryIO) -> Iterator[bytes]:
    """The file's bytes a block at a time (Starlette reads them in a worker thread)."""
    with handle:
        while block := handle.read(1024 * 1024):
            yield block


def _found(info: DocumentInfo | None, wanted_id: str) -> DocumentInfo:
    if info is None:
        raise _not_found(wanted_id)
    return info


def _not_found(wanted_id: str) -> APIError:
    return APIError(
        404,
        f"there is no document {wanted_id!r}; GET /v1/files lists them",
        error_type="invalid_request_error",
        code="file_not_found",
        param="file_id",
    )
