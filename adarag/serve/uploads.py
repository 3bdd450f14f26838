"""A document sent to ``POST /v1/files``: received to disk, parsed in a worker, then kept.

In order, an upload is refused:

1. with 415 unless its Content-Type is ``multipart/form-data`` (field ``file``) or
   ``application/json`` (``{"filename", "text"}``), so a web page cannot send one as a form or
   as text without the browser asking the server first;
2. when ``serve.max_concurrent_uploads`` are being received and parsed, it waits for one to end;
3. its body is read as it arrives (:mod:`adarag.serve.limits` holds it to
   ``serve.max_upload_bytes`` and ``serve.body_read_timeout_s``): a multipart file goes to disk
   (spooled past 1 MiB) and is copied into a private staging folder, so an upload is never held
   in memory whole; a JSON text (held in memory) is checked for ``serve.max_json_depth``;
4. with 400 when a multipart upload has no ``purpose`` field (OpenAI's client always sends
   one; a JSON text defaults to ``assistants``), when its name is not a plain file name of a
   type ingest reads, or it cannot be read as that type; with 422 when parsing it takes longer
   than ``retrieval.max_parse_seconds`` (:mod:`adarag.serve.parse_worker`, which is killed
   then, when the client hangs up or when the server shuts down).

Only then does it replace the document of its name (:meth:`DocumentLibrary.keep`). The staging
folder is removed whatever happens; those a crash left are swept when the server starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from adarag.config import ServeConfig
from adarag.errors import InputError
from adarag.serve.documents import DocumentInfo, DocumentLibrary
from adarag.serve.errors import (
    APIError,
    ShuttingDownError,
    invalid_request,
    unsupported_media_type,
)
from adarag.serve.file_names import checked_name
from adarag.serve.limits import check_json_depth
from adarag.serve.parse_worker import DocumentParser, ParserClosedError, ParseTimeoutError

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


class Uploads:
    """Receives, parses and keeps the documents sent to a knowledge base.

    Args:
        library: Where documents are kept and ingested from.
        parser: Parses each in a worker process.
        config: ``max_concurrent_uploads`` and ``max_json_depth``.
    """

    def __init__(self, library: DocumentLibrary, parser: DocumentParser, config: ServeConfig):
        self.library = library
        self.parser = parser
        self.config = config
        self._slots = asyncio.Semaphore(config.max_concurrent_uploads)

    async def add(self, request: Request) -> DocumentInfo:
        """Receive, check and parse the document ``request`` sends, then keep it.

        Raises:
            APIError: 415, 400, 422 or 503 (shutting down), as the module says.
        """
        media_type = _media_type(request)
        async with self._slots:
            staging = await asyncio.to_thread(self.library.new_staging_directory)
            try:
                name, staged, purpose = await self._receive(request, media_type, staging)
                source = await self._parse(name, staged)
                return await asyncio.to_thread(self.library.keep, name, staged, source, purpose)
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, ignore_errors=True)

    async def _receive(
        self, request: Request, media_type: str, staging: Path
    ) -> tuple[str, Path, str]:
        """``(name, staged file, purpose)``: the document written into ``staging``."""
        if media_type == "multipart/form-data":
            async with request.form(max_files=1, max_fields=8) as form:
                upload = form.get("file")
                if not isinstance(upload, UploadFile):
                    raise invalid_request("send the document as the multipart field 'file'", "file")
                purpose = form.get("purpose")
                if not isinstance(purpose, str) or not purpose.strip():
                    raise invalid_request(
                        "purpose: the upload has no purpose; send the form field 'purpose' "
                        "with the file (e.g. purpose=assistants), as OpenAI's Files API requires",
                        "purpose",
                    )
                name = _checked(upload.filename or "")
                staged = staging / name
                await asyncio.to_thread(_copy, upload.file, staged)
                return name, staged, purpose.strip()
        body = await request.body()
        check_json_depth(body, self.config.max_json_depth)
        try:
            sent = TextDocument.model_validate(json.loads(body))
        except (ValueError, ValidationError) as err:  # json.JSONDecodeError is a ValueError
            raise invalid_request(
                "send a multipart upload (field 'file') or JSON "
                f'{{"filename": "notes.md", "text": "..."}} ({str(err).splitlines()[0]})'
            ) from err
        name = _checked(sent.name())
        staged = staging / name
        await asyncio.to_thread(staged.write_bytes, sent.text.encode("utf-8", "surrogatepass"))
        return name, staged, sent.purpose

    async def _parse(self, name: str, staged: Path) -> Any:
        try:
            return await self.parser.read(staged)
        except ParseTimeoutError as err:
            raise APIError(
                422, str(err), error_type="invalid_request_error", code="parse_timeout"
            ) from None
        except ParserClosedError:
            raise ShuttingDownError() from None
        except InputError as err:  # the server's staging path stays private
            raise invalid_request(str(err).replace(str(staged), name)) from None


def _media_type(request: Request) -> str:
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in UPLOAD_MEDIA_TYPES:
        raise unsupported_media_type(
            content_type, "multipart/form-data (field 'file') or application/json"
        )
    return media_type


def _checked(filename: str) -> str:
    try:
        return checked_name(filename)
    except InputError as err:
        raise invalid_request(str(err), "file") from None


def _copy(source: BinaryIO, target: Path) -> None:
    source.seek(0)
    with target.open("xb") as written:
        shutil.copyfileobj(source, written, 1024 * 1024)
