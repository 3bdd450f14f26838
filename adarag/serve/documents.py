"""Documents added over HTTP: kept as files, ingested and warmed in the background.

A document is read (parsed) when it arrives, so one that cannot be read is refused at once and
never replaces what is stored under its name. It is then kept in the documents directory under
its name (sending the same name again replaces the document; its unchanged chunks keep their ids
and KV) and queued: one background thread embeds and stores its chunks, then warms their KV one
chunk at a time under the engine lock, so answers keep being served meanwhile. The embedded
Chroma belongs to the server process, so the server makes these writes itself.

Every document the knowledge base holds is listed, also those ``adarag ingest`` added, under an
id hashed from its source. Deleting one removes its chunks, and its file when it was sent over
HTTP (a file ingested from elsewhere stays where it is). Progress is kept in memory; when the
server starts, the documents sent before are warmed again (:meth:`DocumentLibrary.resume`: the
chunks whose KV is stored are skipped), so one whose warming a stop cut short is listed as
warming, not processed, until its KV is complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal

from adarag.files import unlink_quietly
from adarag.pipeline import AdaRAG
from adarag.retrievers import KnowledgeBase
from adarag.retrievers.sources import SourceFile
from adarag.schema import Chunk
from adarag.serve.staging import new_staging_directory, sweep_staging

logger = logging.getLogger(__name__)

State = Literal["queued", "embedding", "warming", "ready", "failed"]
"""Where a document is: waiting, its chunks being embedded and stored, their KV being computed,
answerable with its KV cached, or failed (its error says why)."""

_OPENAI_STATUS = {"ready": "processed", "failed": "error"}

EMPTY_KNOWLEDGE_BASE = (
    "the knowledge base is empty: add documents with POST /v1/files (OpenAI's client: "
    "client.files.create(file=open(PATH, 'rb'), purpose='assistants')) or on the chat page at "
    "/; questions are answered once a document's chunks are stored"
)
"""What a server over an empty knowledge base logs when it starts and answers questions with."""


def file_id(source: str) -> str:
    """The id a document is listed under: a hash of its source (the stored file's path)."""
    return "file-" + hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:24]


@dataclass(frozen=True)
class DocumentInfo:
    """One document as listed: its id, file name, size, state and number of stored chunks."""

    file_id: str
    filename: str
    source: str
    num_bytes: int
    created_at: int
    purpose: str
    state: State
    num_chunks: int
    error: str | None = None

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's file object, with adarag's progress in ``adarag``."""
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.num_bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": _OPENAI_STATUS.get(self.state, "uploaded"),
            "status_details": self.error,
            "adarag": {"state": self.state, "num_chunks": self.num_chunks, "error": self.error},
        }


@dataclass
class _Progress:
    state: State
    generation: int
    purpose: str
    created_at: int
    error: str | None = None


class DocumentLibrary:
    """The documents of a served knowledge base: added, listed and deleted over HTTP.

    Args:
        rag: The pipeline whose tokenizer cuts the chunks and whose engine warms their KV.
        kb: The knowledge base the documents go to (``rag``'s retriever).
        directory: Where documents sent over HTTP are kept.
    """

    def __init__(self, rag: AdaRAG, kb: KnowledgeBase, directory: Path) -> None:
        self.rag = rag
        self.kb = kb
        self.directory = directory
        self._progress: dict[str, _Progress] = {}
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()  # guards the two dicts above
        self._write_lock = threading.Lock()  # one writer of the knowledge base at a time
        self._closing = threading.Event()
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adarag-documents")
        sweep_staging(directory)  # what uploads cut short by a crash left

    def new_staging_directory(self) -> Path:
        """A private folder of its own for one upload, named for this process; remove it after."""
        return new_staging_directory(self.directory)

    def keep(self, name: str, staged: Path, source: SourceFile, purpose: str) -> DocumentInfo:
        """Keep a document read from ``staged`` under its name and queue its ingestion.

        The file replaces the one of that name and takes the next generation under one lock, so
        of two uploads of one name the one kept on disk is the one ingested (the last writer
        wins); the older one's ingestion stops.

        Args:
            name: The checked file name (:func:`~adarag.serve.file_names.checked_name`).
            staged: The file as received, in a staging folder of this directory.
            source: What it holds (:meth:`KnowledgeBase.read`).
            purpose: OpenAI's purpose field, listed back.
        """
        target = self.directory / name
        source = dataclasses.replace(source, path=target.resolve())
        key = str(source.path)
        with self._lock:
            os.replace(staged, target)
            generation = self._generations.get(key, 0) + 1
            self._generations[key] = generation
            self._progress[key] = _Progress("queued", generation, purpose, int(time.time()))
        self._jobs.submit(self._ingest, source, generation)
        logger.info("queued %s (%d bytes) for ingestion", name, target.stat().st_size)
        found = self._info(key, None)
        assert found is not None, f"{key} vanished while it was added"
        return found

    def documents(self) -> list[DocumentInfo]:
        """Every document: the stored ones and those still being added, by file name."""
        counts = self.kb.sources()
        with self._lock:
            keys = set(counts) | set(self._progress)
        found = (self._info(key, counts.get(key, 0)) for key in keys if key)
        return sorted((info for info in found if info), key=lambda i: (i.filename, i.file_id))

    def find(self, wanted_id: str) -> DocumentInfo | None:
        """The document listed under ``wanted_id``, or None."""
        with self._lock:  # one being added: found without listing the knowledge base
            key = next((key for key in self._progress if file_id(key) == wanted_id), None)
        if key is not None:
            return self._info(key, None)
        return next((info for info in self.documents() if info.file_id == wanted_id), None)

    def delete(self, wanted_id: str) -> DocumentInfo | None:
        """Remove a document's chunks (and its file, if sent over HTTP); None if unknown."""
        info = self.find(wanted_id)
        if info is None:
            return None
        with self._write_lock:
            with self._lock:  # a queued or running ingestion of it stops
                self._generations[info.source] = self._generations.get(info.source, 0) + 1
                self._progress.pop(info.source, None)
            self.kb.remove_source(info.source)
            if self._is_sent(info.source):
                unlink_quietly(Path(info.source))
        logger.info("deleted %s (%d chunks)", info.filename, info.num_chunks)
        return info

    def is_empty(self) -> bool:
        """Whether the knowledge base holds no chunk."""
        return self.kb.count() == 0

    def close(self) -> None:
        """Stop the background work: a warming stops after its chunk, queued work is dropped."""
        self._closing.set()
        self._jobs.shutdown(wait=True, cancel_futures=True)

    def _ingest(self, source: SourceFile, generation: int) -> None:
        key = str(source.path)
        try:
            with self._write_lock:
                if not self._set(key, generation, "embedding"):
                    return  # deleted or replaced while it waited
                self.kb.ingest_sources([source], tokenizer=self.rag.tokenizer)
                chunks = self.kb.chunks(sources=[key])
            # a file with no text (a scanned PDF) is listed ready with the reason it holds none
            self._warm(key, generation, chunks, source.empty_reason)
        except Exception as err:  # the job's failure is the document's state; the server goes on
            logger.exception("adding %s failed", source.path.name)
            self._set(key, generation, "failed", f"{type(err).__name__}: {err}")

    def resume(self) -> int:
        """Warm the documents sent before this server started again, in the background.

        A server stopped (or killed) while warming a document leaves chunks without KV; each
        document is listed as warming until every chunk of it has its KV (chunks stored already
        are skipped at the cost of a lookup), then ready. Returns how many were queued.
        """
        queued: list[tuple[str, int]] = []
        sent = [key for key in self.kb.sources() if self._is_sent(key)]
        with self._lock:
            for key in sent:
                if key in self._progress:
                    continue  # sent again since this server started
                generation = self._generations.get(key, 0) + 1
                self._generations[key] = generation
                created_at = int(Path(key).stat().st_mtime) if Path(key).exists() else 0
                self._progress[key] = _Progress("warming", generation, "knowledge_base", created_at)
                queued.append((key, generation))
        for key, generation in queued:
            self._jobs.submit(self._resume, key, generation)
        if queued:
            logger.info("checking the KV of %d documents sent before the restart", len(queued))
        return len(queued)

    def _resume(self, key: str, generation: int) -> None:
        try:
            with self._write_lock:
                chunks = self.kb.chunks(sources=[key])
            self._warm(key, generation, chunks)
        except Exception as err:  # as in _ingest
            logger.exception("warming %s failed", PurePath(key).name)
            self._set(key, generation, "failed", f"{type(err).__name__}: {err}")

    def _warm(
        self, key: str, generation: int, chunks: list[Chunk], note: str | None = None
    ) -> None:
        """Compute the KV of ``chunks`` (those without), one at a time, then list it ready.

        ``note`` goes with the ready state as its details (why a file gave no chunk).
        """
        if not self._set(key, generation, "warming"):
            return
        num_computed = 0
        for chunk in chunks:
            if self._closing.is_set() or not self._set(key, generation, "warming"):
                return
            num_computed += self.rag.warm([chunk])
        self._set(key, generation, "ready", note)
        logger.info(
            "%s is ready: %d chunks stored, %d warmed now",
            PurePath(key).name,
            len(chunks),
            num_computed,
        )

    def _set(self, key: str, generation: int, state: State, error: str | None = None) -> bool:
        """Move a document's progress on; False when a newer upload or a delete superseded it."""
        with self._lock:
            progress = self._progress.get(key)
            if progress is None or progress.generation != generation:
                return False
            progress.state, progress.error = state, error
            return True

    def _info(self, key: str, num_chunks: int | None) -> DocumentInfo | None:
        if num_chunks is None:
            num_chunks = self.kb.count_source(key)
        with self._lock:
            progress = dataclasses.replace(self._progress[key]) if key in self._progress else None
        path = Path(key)
        try:
            stat = path.stat() if path.is_absolute() else None
        except OSError:
            stat = None
        if progress is None and not num_chunks:
            return None
        return DocumentInfo(
            file_id=file_id(key),
            filename=PurePath(key).name,
            source=key,
            num_bytes=stat.st_size if stat else 0,
            created_at=progress.created_at if progress else int(stat.st_mtime) if stat else 0,
            purpose=progress.purpose if progress else "knowledge_base",
            state=progress.state if progress else "ready",
            num_chunks=num_chunks,
            error=progress.error if progress else None,
        )

    def kept_file(self, info: DocumentInfo) -> Path | None:
        """The file this library keeps for ``info`` (sent over HTTP); None for one ingested."""
        return Path(info.source) if self._is_sent(info.source) else None

    def _is_sent(self, source: str) -> bool:
        """Whether ``source`` is a file this library keeps (sent over HTTP)."""
        return Path(source).parent == self.directory.resolve()
