"""Dense retrieval from Chroma (chromadb is imported lazily, only here).

One embedded ``PersistentClient`` per directory and process, with telemetry off; an advisory
file lock keeps a second process from opening the same directory (Chroma's embedded mode is not
multi-process safe, and a second process can otherwise hang on SQLite's busy timeout). A Chroma
server (``chroma run``) is reached with an ``HttpClient`` instead; it serialises its clients'
writes itself, so any number of processes may share it and no lock is taken. Queries
are embedded by adarag (:class:`~adarag.retrievers.embedding.SentenceEmbedder`) and passed as
vectors, so a collection's persisted embedding function is never run and nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

from adarag.errors import InputError, KnowledgeBaseError, MissingDependencyError
from adarag.files import make_private_directories, process_running
from adarag.retrievers.embedding import as_embedder
from adarag.schema import Chunk

logger = logging.getLogger(__name__)

EMBEDDING_MODEL_KEY = "adarag:embedding_model"
EMBEDDING_DIMENSION_KEY = "adarag:embedding_dimension"
LOCK_FILE = "adarag.lock"
_HIDDEN_METADATA_PREFIX = "_node"  # LlamaIndex's serialised node, too large to carry around


class QueryEmbedder(Protocol):
    """What retrieval needs from an embedding model."""

    name: str

    @property
    def dimension(self) -> int:
        """Length of every embedding."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The normalised embedding of a query."""
        ...


def open_client(directory: Path) -> Any:
    """An embedded Chroma client persisting to ``directory``, telemetry off.

    Raises:
        MissingDependencyError: chromadb is not installed.
    """
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError as err:
        raise MissingDependencyError("chromadb", "chroma") from err
    make_private_directories(directory)
    return chromadb.PersistentClient(
        path=str(directory), settings=Settings(anonymized_telemetry=False)
    )


def open_server_client(url: str) -> Any:
    """A client of the Chroma server at ``url`` (``http(s)://HOST[:PORT]``), telemetry off.

    Raises:
        MissingDependencyError: chromadb is not installed.
        KnowledgeBaseError: No Chroma server answers at ``url``.
    """
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError as err:
        raise MissingDependencyError("chromadb", "chroma") from err
    parts = urlsplit(url)
    is_ssl = parts.scheme == "https"
    port = parts.port or (443 if is_ssl else 8000)
    try:
        # the constructor asks the server for its default tenant: an unreachable one fails here
        return chromadb.HttpClient(
            host=str(parts.hostname),
            port=port,
            ssl=is_ssl,
            settings=Settings(anonymized_telemetry=False),
        )
    except ValueError as err:
        raise KnowledgeBaseError(
            f"no Chroma server answers at {url} ({err}). Start one with `chroma run --path "
            f"DIRECTORY --port {port}` (installed with adarag's chroma extra), or fix "
            "retrieval.chroma_url (--chroma-url)"
        ) from err


class DirectoryLock:
    """An exclusive, non-blocking advisory lock on a Chroma directory for this process.

    A second holder in the same process shares the lock (Chroma shares one client per path
    within a process); a holder in another process makes :meth:`acquire` raise. A lock never
    released is released cleanly when its holder is garbage-collected or the interpreter exits,
    so only a process that died (killed, crashed) leaves its pid behind.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._release: weakref.finalize | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            KnowledgeBaseError: Another process holds it, or the directory cannot be created
                or written.
        """
        try:
            make_private_directories(self.path.parent)
            handle = self.path.open("a+")
        except OSError as err:
            raise KnowledgeBaseError(
                f"cannot use {self.path.parent} as the Chroma directory ({err.strerror or err}); "
                "point --chroma-dir (retrieval.chroma_directory) at a directory you can write"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            if holder == str(os.getpid()):
                return  # held by another knowledge base of this process: share it
            raise KnowledgeBaseError(
                f"the Chroma directory {self.path.parent} is in use by another process "
                f"(pid {holder or 'unknown'}); embedded Chroma is not multi-process safe. Close "
                "that process, or point retrieval.chroma_directory elsewhere"
            ) from err
        handle.seek(0)
        previous = handle.read().strip()
        if previous.isdigit() and not process_running(int(previous)):
            logger.warning(
                "recovered the lock of %s left by pid %s, which is no longer running (it "
                "stopped without closing; a re-run of its ingest completes what it left)",
                self.path.parent,
                previous,
            )
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        # runs once: from release(), when this object is collected, or at interpreter exit
        self._release = weakref.finalize(self, _release_lock_file, handle, os.getpid())

    def release(self) -> None:
        """Give the lock back (no-op when this object does not hold it)."""
        if self._release is not None:
            self._release()
            self._release = None


def _release_lock_file(handle: IO[str], owner_pid: int) -> None:
    """Empty the lock file and close it; closing the descriptor releases the flock.

    A forked child that inherited the descriptor only closes its copy: the lock stays its
    parent's, and so does the pid in the file.
    """
    if os.getpid() == owner_pid:
        handle.seek(0)
        handle.truncate()  # a clean release leaves no pid behind
    handle.close()


def chroma_where(fields: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Chroma's filter for chunks whose metadata has every ``key: value`` of ``fields``."""
    if not fields:
        return None
    if len(fields) == 1:
        return dict(fields)
    return {"$and": [{key: value} for key, value in fields.items()]}


def check_embedding_model(collection: Any, embedder: QueryEmbedder) -> None:
    """Fail loudly when the collection's vectors were made by another embedding model.

    Raises:
        KnowledgeBaseError: Stored dimension or (adarag-written) model name differ.
    """
    metadata = collection.metadata or {}
    stored_dimension = metadata.get(EMBEDDING_DIMENSION_KEY)
    if stored_dimension is None:
        sample = collection.get(limit=1, include=["embeddings"])["embeddings"]
        stored_dimension = len(sample[0]) if sample is not None and len(sample) else None
    stored_model = metadata.get(EMBEDDING_MODEL_KEY)
    if stored_dimension is not None and int(stored_dimension) != embedder.dimension:
        raise KnowledgeBaseError(
            f"Chroma collection {collection.name!r} holds {stored_dimension}-dimensional "
            f"embeddings{f' from {stored_model}' if stored_model else ''}, but the embedding "
            f"model {embedder.name} makes {embedder.dimension}-dimensional ones. Use the model "
            "it was built with (retrieval.embedding_model), or another collection "
            "(retrieval.collection); nothing was changed"
        )
    if stored_model is not None and stored_model != embedder.name:
        raise KnowledgeBaseError(
            f"Chroma collection {collection.name!r} was built with the embedding model "
            f"{stored_model}, not {embedder.name}; use the same model "
            "(retrieval.embedding_model) or another collection; nothing was changed"
        )
    if stored_model is None:
        _check_chroma_embedding_function(collection, embedder)


def _check_chroma_embedding_function(collection: Any, embedder: QueryEmbedder) -> None:
    """Refuse a collection whose persisted Chroma embedding function is another model.

    Collections made by plain chromadb, LlamaIndex or LangChain record the embedding function
    they were made with; vectors of another model of the same dimension would retrieve junk
    without any error.
    """
    function = (getattr(collection, "configuration_json", None) or {}).get("embedding_function")
    if not function or function.get("type") != "known" or function.get("name") == "default":
        # none recorded (made by adarag, or vectors given directly), not knowable, or Chroma's
        # default, which frameworks that embed on their own leave in place: no evidence
        return
    name = str(function.get("name"))
    model = (function.get("config") or {}).get("model_name", name)
    if str(model).rsplit("/", 1)[-1] != embedder.name:
        raise KnowledgeBaseError(
            f"Chroma collection {collection.name!r} was embedded by Chroma's {name!r} embedding "
            f"function (model {model!r}), not by {embedder.name}; its vectors cannot be "
            "compared with this model's. Pass the same model (retrieval.embedding_model, or "
            "embedder=...), or use another collection; nothing was changed"
        )


class ChromaRetriever:
    """Top-k chunks of a Chroma collection by cosine similarity to the query.

    Scores are cosine similarities in [-1, 1], higher is better, whatever the collection's
    distance space: 1 - d in a ``cosine`` space, and in ``l2`` and ``ip`` spaces the cosine of the
    query with each returned vector (stored vectors need not be normalised there). The chunks are
    the collection's own nearest neighbours, ordered by that score. Each chunk's metadata also
    carries the raw ``distance`` and the ``space``. Works on collections written by adarag,
    LlamaIndex, LangChain or plain chromadb.

    Args:
        collection: A chromadb collection.
        embedder: The model that embedded the collection's documents (an adarag embedder or a
            chromadb ``EmbeddingFunction``).
        min_top_score: When the best chunk scores below it, no chunk is returned (the question
            has no retrievable context). None returns the top-k whatever their scores.
        where: A Chroma metadata filter applied to every query.

    Raises:
        KnowledgeBaseError: The collection was embedded by another model.
    """

    def __init__(
        self,
        collection: Any,
        embedder: QueryEmbedder,
        *,
        min_top_score: float | None = None,
        where: dict[str, Any] | None = None,
    ) -> None:
        embedder = as_embedder(embedder)
        check_embedding_model(collection, embedder)
        self.collection = collection
        self.embedder = embedder
        self.min_top_score = min_top_score
        self.where = where
        space = (collection.configuration_json.get("hnsw") or {}).get("space")
        self.space: str = space or (collection.metadata or {}).get("hnsw:space", "l2")

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` most similar chunks, best first.

        Raises:
            InputError: ``top_k`` is not positive.
            KnowledgeBaseError: The collection is empty.
        """
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        if self.collection.count() == 0:
            raise KnowledgeBaseError(
                f"the knowledge base (Chroma collection {self.collection.name!r}) is empty; "
                "ingest documents first, e.g. `adarag ingest notes.md passages.jsonl`"
            )
        query_vector = self.embedder.embed_query(query)
        is_cosine = self.space == "cosine"
        result = self.collection.query(
            query_embeddings=[query_vector],
            n_results=top_k,
            where=self.where,
            include=["documents", "metadatas", "distances"] + ([] if is_cosine else ["embeddings"]),
        )
        distances = result["distances"][0]
        if is_cosine:
            scores = [1.0 - float(distance) for distance in distances]
        else:  # l2 and ip distances depend on the stored vectors' lengths
            scores = [_cosine(query_vector, vector) for vector in result["embeddings"][0]]
        chunks = [
            self._chunk(chunk_id, text, metadata, distance, score)
            for chunk_id, text, metadata, distance, score in zip(
                result["ids"][0],
                result["documents"][0],
                result["metadatas"][0],
                distances,
                scores,
                strict=True,
            )
            if text
        ]
        chunks.sort(key=lambda chunk: -float(chunk.score or 0.0))
        best_score = chunks[0].score if chunks else None
        threshold = self.min_top_score
        if best_score is not None and threshold is not None and best_score < threshold:
            logger.info("best chunk scores %.3f < %.3f: no context", best_score, threshold)
            return []
        return chunks

    def _chunk(
        self,
        chunk_id: str,
        text: str,
        metadata: dict[str, Any] | None,
        distance: float,
        score: float,
    ) -> Chunk:
        kept = {
            key: value
            for key, value in (metadata or {}).items()
            if not key.startswith(_HIDDEN_METADATA_PREFIX)
        }
        kept.update(distance=float(distance), space=self.space)
        return Chunk(text, chunk_id=chunk_id, score=float(score), metadata=kept)


def _cosine(query: Sequence[float], vector: Sequence[float]) -> float:
    """Cosine similarity of ``query`` and ``vector`` (0 for a zero vector)."""
    dot = sum(float(q) * float(v) for q, v in zip(query, vector, strict=True))
    norms = math.sqrt(sum(float(q) ** 2 for q in query) * sum(float(v) ** 2 for v in vector))
    return dot / norms if norms else 0.0
