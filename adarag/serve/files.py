"""``/v1/files``: documents added, listed and deleted over HTTP, in OpenAI's Files format.

OpenAI's client works as is (``client.files.create(file=..., purpose="assistants")``,
``files.list()``, ``files.retrieve(id)``, ``files.delete(id)``); a text can also be sent as JSON
(``{"filename": "notes.md", "text": "..."}``). A file object's ``status`` is ``uploaded``
while its chunks are embedded and warmed, ``processed`` once its KV is cached, ``error`` if that
failed; ``adarag.state`` says which step it is at. See :mod:`adarag.serve.documents`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from adarag.serve.documents import DocumentInfo, DocumentLibrary
from adarag.serve.errors import APIError, invalid_request, unsupported_media_type

UPLOAD_MEDIA_TYPES = frozenset({"multipart/form-data", "application/json"})


class TextDocument(BaseModel):
    """A document sent as JSON text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(min_length=1)
    filename: str | None = Field(default=None, min_length=1)
    purpose: str = "assistants"

    def name(self) -> str:
        """The file name, or one made from the text's hash (a markdown document)."""
        digest = hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return self.filename or f"text-{digest}.md"


def files_router(
    library: DocumentLibrary | None, check_key: Callable[[Request], None]
) -> APIRouter:
    """The ``/v1/files`` routes over ``library`` (None: the server has no knowledge base)."""
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
        kept = documents()
        filename, data, purpose = await _sent_document(request)
        info = await asyncio.to_thread(kept.add, filename, data, purpose)
        return info.as_openai()

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


async def _sent_document(request: Request) -> tuple[str, bytes, str]:
    """``(filename, bytes, purpose)`` of a multipart upload or a JSON text.

    Raises:
        APIError: 415, the body is neither (by its Content-Type, so a web page cannot send a
            document as a form or text without the browser asking the server first); 400, it
            is not well formed.
    """
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in UPLOAD_MEDIA_TYPES:
        raise unsupported_media_type(
            content_type, "multipart/form-data (field 'file') or application/json"
        )
    if media_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=8) as form:
            upload = form.get("file")
            purpose = form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise invalid_request("send the document as the multipart field 'file'", "file")
            return upload.filename or "", await upload.read(), str(purpose or "assistants")
    try:
        body = TextDocument.model_validate(json.loads(await request.body()))
    except (ValueError, ValidationError) as err:  # json.JSONDecodeError is a ValueError
        raise invalid_request(
            "send a multipart upload (field 'file') or JSON "
            f'{{"filename": "notes.md", "text": "..."}} ({str(err).splitlines()[0]})'
        ) from err
    return body.name(), body.text.encode("utf-8", "surrogatepass"), body.purpose


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
