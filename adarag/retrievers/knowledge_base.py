"""A Chroma knowledge base on disk: deduplicated ingestion of files, and dense retrieval.

Each chunk's Chroma id is a hash of its source file, document key, occurrence and text, so an
unchanged chunk keeps its id. Every chunk also records its file's SHA-256 and chunk count:
re-ingesting an unchanged file is detected from those alone and does no work (no tokenising,
embedding or KV). A changed file adds its new chunks before it removes the stale ones, so a
failure midway never loses what the knowledge base held.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.config import AdaRagConfig, RetrievalConfig
from adarag.errors import ConfigError, InputError, KnowledgeBaseError
from adarag.retrievers.chroma import (
    EMBEDDING_DIMENSION_KEY,
    EMBEDDING_MODEL_KEY,
    ChromaRetriever,
    DirectoryLock,
    chroma_where,
    open_client,
    open_server_client,
)
from adarag.retrievers.chunk_plan import content_chunk_id, plan_chunks
from adarag.retrievers.chunking import tokenizer_spans
from adarag.retrievers.embedding import Embedder, SentenceEmbedder, as_embedder
from adarag.retrievers.external_splitter import ExternalSplitter
from adarag.retrievers.gathering import GatheredFiles, gather_files, read_file
from adarag.retrievers.paths import SkippedFile
from adarag.retrievers.sources import SourceFile
from adarag.schema import Chunk

logger = logging.getLogger(__name__)

WRITE_BATCH_SIZE = 1000
"""Ids per Chroma update or delete call (under every backend's batch limit)."""

ProgressCallback = Callable[[int, int], None]
"""Called with (chunks embedded so far, chunks to embed) while ingesting."""


@dataclass(frozen=True)
class IngestReport:
    """What one ingestion changed.

    Attributes:
        num_files: Files read that hold text.
        num_files_unchanged: Of those, the files the knowledge base already holds as they are.
        num_chunks_kept: Chunks of changed files that were already stored.
        num_chunks_removed: Stale chunks of changed files that were removed.
        added: Chunks added (embedded and stored); their KV is what needs warming.
        sources: The files read, as the knowledge base names them (``source`` metadata).
        skipped: The files of the folders given that were not read (another type, hidden, not
            a regular file), each with the reason.
        unreadable: The files of the folders given that could not be read (a damaged or
            encrypted PDF), each with the reason.
        empty: The files read without any text (a scanned PDF), each with the reason; a file
            that had text before loses its chunks.
    """

    num_files: int
    num_files_unchanged: int
    num_chunks_kept: int
    num_chunks_removed: int
    added: tuple[Chunk, ...]
    sources: tuple[str, ...] = ()
    skipped: tuple[SkippedFile, ...] = ()
    unreadable: tuple[SkippedFile, ...] = ()
    empty: tuple[SkippedFile, ...] = ()


class KnowledgeBase:
    """Documents in a Chroma collection, retrievable as adarag chunks.

    The collection lives in an embedded, on-disk Chroma (``retrieval.chroma_directory``, one
    process at a time) or on a Chroma server (``retrieval.chroma_url``, shared by processes).

    Setup:
        ``pip install 'adarag[chroma]'`` (``make install`` does it).

    Instantiate:
        >>> from adarag import AdaRAG, AdaRagConfig
        >>> from adarag.retrievers import KnowledgeBase
        >>> config = AdaRagConfig()
        >>> kb = KnowledgeBase.from_config(config)  # <home>/chroma, collection "adarag"

    Ingest (unchanged files are skipped), then warm the new chunks' KV:
        >>> rag = AdaRAG(config, retriever=kb)
        >>> report = kb.ingest(["notes.md", "manual.pdf", "docs/"], tokenizer=rag.tokenizer)
        >>> rag.warm(report.added)

    Split with a LlamaIndex node parser or a LangChain text splitter:
        >>> from llama_index.core.node_parser import SentenceSplitter
        >>> kb = KnowledgeBase(config.retrieval, config.home, splitter=SentenceSplitter())

    Query:
        >>> rag.query("What do the notes say about X?").chunks

    Args:
        config: Collection name, directory or server URL, chunk sizes, embedding model,
            ``min_top_score``.
        home: adarag's home; the default directory is ``<home>/chroma``.
        client: A chromadb client to use instead of opening the directory (then no lock is
            taken: the client's owner is responsible for sharing it).
        embedder: The embedding model (an adarag embedder or a chromadb
            ``EmbeddingFunction``); ``config.embedding_model`` when None.
        create: Create the collection when it does not exist (ingestion); False for a reader,
            which then gets a clear error instead of a new empty collection.
        splitter: How ingest cuts documents: a LlamaIndex ``NodeParser``, a LangChain
            ``TextSplitter`` or a function from a text to its pieces, applied to each section
            (see :class:`~adarag.retrievers.external_splitter.ExternalSplitter`); None: the
            built-in ``config.splitter``.

    Raises:
        ConfigError: Neither ``home``, ``config.chroma_directory``, ``config.chroma_url`` nor
            ``client`` is given, or ``splitter`` is not a splitter.
        KnowledgeBaseError: Another process holds the directory, no server answers at
            ``config.chroma_url``, the collection was built with another embedding model, or
            (``create=False``) it does not exist.
    """

    def __init__(
        self,
        config: RetrievalConfig,
        home: Path | None = None,
        *,
        client: Any = None,
        embedder: Embedder | Callable[..., Any] | None = None,
        create: bool = True,
        splitter: Any = None,
    ) -> None:
        self.config = config
        self.splitter = ExternalSplitter(splitter) if splitter is not None else None
        self.embedder: Embedder = (
            as_embedder(embedder)
            if embedder is not None
            else SentenceEmbedder(config.embedding_model, config.embedding_batch_size)
        )
        self.directory: Path | None = None
        self._lock: DirectoryLock | None = None
        if client is None and config.chroma_url is not None:
            client = open_server_client(config.chroma_url)  # the server serialises writers
        if client is None:
            if config.chroma_directory is None and home is None:
                raise ConfigError(
                    "no Chroma directory: pass home=... (the knowledge base goes to <home>/chroma) "
                    "or set retrieval.chroma_directory, or use KnowledgeBase.from_config(config)"
                )
            self.directory = config.chroma_directory or Path(str(home)) / "chroma"
            self._lock = DirectoryLock(self.directory)
            self._lock.acquire()
            client = open_client(self.directory)
        try:
            if not create:
                self._check_exists(client)
            self._client = client
            self._collection: Any = None
            self._retriever: ChromaRetriever | None = None
            self._is_new = config.collection not in _collection_names(client)
            self._open_collection()
        except BaseException:
            self.close()
            raise

    @property
    def collection(self) -> Any:
        """The chromadb collection (made again if a failed ingest removed it)."""
        if self._collection is None:
            self._open_collection()
        return self._collection

    @property
    def retriever(self) -> ChromaRetriever:
        """Dense retrieval over the collection."""
        if self._retriever is None:
            self._open_collection()
        assert self._retriever is not None, "the collection was not opened"
        return self._retriever

    def _open_collection(self) -> None:
        """Open (or create) the collection, and the retriever over it."""
        self._collection = self._client.get_or_create_collection(
            self.config.collection,
            embedding_function=None,
            configuration={"hnsw": {"space": "cosine"}},
            metadata={
                EMBEDDING_MODEL_KEY: self.embedder.name,
                EMBEDDING_DIMENSION_KEY: self.embedder.dimension,
            },
        )
        self._retriever = ChromaRetriever(
            self._collection,
            self.embedder,
            min_top_score=self.config.min_top_score,
            where=chroma_where(self.config.where),
        )

    @classmethod
    def from_config(
        cls, config: AdaRagConfig, *, create: bool = True, splitter: Any = None
    ) -> KnowledgeBase:
        """The knowledge base of ``config.retrieval`` under ``config.home``."""
        return cls(config.retrieval, config.home, create=create, splitter=splitter)

    def _check_exists(self, client: Any) -> None:
        """Raise :class:`KnowledgeBaseError` naming the collections there are, if ours is not."""
        names = _collection_names(client)
        if self.config.collection not in names:
            where = f" in {self.directory}" if self.directory else ""
            if self.config.chroma_url is not None:
                where = f" on the Chroma server {self.config.chroma_url}"
            held = ", ".join(repr(name) for name in names) or "none"
            raise KnowledgeBaseError(
                f"there is no collection {self.config.collection!r}{where} (collections: {held}); "
                "check --collection, or add documents first with `adarag ingest PATH...`"
            )

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the directory lock (if any); the data stays stored."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def splitter_name(self) -> str:
        """The splitter ingest cuts with, as each chunk records it (``splitter`` metadata)."""
        return self.splitter.name if self.splitter is not None else self.config.splitter

    # --- reading

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` most similar chunks (see :class:`ChromaRetriever`)."""
        return self.retriever.retrieve(query, top_k)

    def count(self) -> int:
        """Chunks stored."""
        return int(self.collection.count())

    def has_filtered_chunks(self) -> bool:
        """Whether any stored chunk passes the metadata filter (``retrieval.where``)."""
        where = chroma_where(self.config.where)
        if where is None:
            return self.count() > 0
        return bool(self.collection.get(where=where, limit=1, include=[])["ids"])

    def chunks(self, sources: Sequence[str] | None = None) -> list[Chunk]:
        """Every stored chunk (of ``sources`` only, when given), in Chroma's order."""
        if sources is not None and not sources:
            return []
        where = None if sources is None else {"source": {"$in": list(sources)}}
        stored = self.collection.get(where=where, include=["documents", "metadatas"])
        return [
            Chunk(text, chunk_id=chunk_id, metadata=dict(metadata or {}))
            for chunk_id, text, metadata in zip(
                stored["ids"], stored["documents"], stored["metadatas"], strict=True
            )
            if text
        ]

    # --- writing

    def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        tokenizer: Any,
        on_progress: ProgressCallback | None = None,
        strict: bool = False,
    ) -> IngestReport:
        """Chunk, embed and store files; skip the ones stored unchanged.

        Args:
            paths: Files or folders: text, markdown, JSONL passages, PDF, HTML, Word (.docx)
                and CSV files (:mod:`adarag.retrievers.readers`). A folder's other files are
                left out and named in :attr:`IngestReport.skipped`.
            tokenizer: The model's Hugging Face fast tokenizer (``AdaRAG.tokenizer``): chunk
                sizes are counted in its tokens.
            on_progress: Called as chunks are embedded.
            strict: Refuse to ingest anything when a file is skipped, cannot be read or holds
                no text.

        A folder's files that cannot be read are left out and named in
        :attr:`IngestReport.unreadable`, files without text in :attr:`IngestReport.empty`
        (see :mod:`adarag.retrievers.gathering`).

        Raises:
            InputError: A path is missing, a file given by name is of another type or cannot be
                read (not UTF-8, larger than ``max_file_bytes``, a line over
                ``max_line_chars``, a document that cannot be parsed, a JSONL line that is not
                a passage), or (``strict``) a file is skipped, unreadable or empty. Every path
                is read before anything is written; a collection this knowledge base created
                is removed again when nothing was stored in it.
        """
        try:
            gathered = gather_files(paths, self.read, strict=strict)
        except InputError:
            self._remove_if_new_and_empty()
            raise
        return self.ingest_gathered(gathered, tokenizer=tokenizer, on_progress=on_progress)

    def ingest_gathered(
        self,
        gathered: GatheredFiles,
        *,
        tokenizer: Any,
        on_progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Chunk, embed and store the files :func:`.gathering.gather_files` read.

        The files it left out are named in the report.
        """
        report = self.ingest_sources(gathered.sources, tokenizer=tokenizer, on_progress=on_progress)
        return dataclasses.replace(report, skipped=gathered.skipped, unreadable=gathered.unreadable)

    def read(self, path: Path) -> SourceFile:
        """One file read into documents, under the configured limits (nothing is stored).

        Raises:
            InputError: As :meth:`ingest` says of one file.
        """
        return read_file(path, self.config)

    def ingest_sources(
        self,
        sources: Sequence[SourceFile],
        *,
        tokenizer: Any,
        on_progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Chunk, embed and store files already read (:meth:`read`); skip unchanged ones."""
        changed = [source for source in sources if not self._holds(source)]
        spans = tokenizer_spans(tokenizer)
        planned = {
            source.path: plan_chunks(source, self.config, spans, self.splitter)
            for source in changed
        }
        new_chunks: list[Chunk] = []
        kept: dict[Path, list[str]] = {}
        stale: list[str] = []
        for source in changed:
            found = self.collection.get(where={"source": str(source.path)}, include=[])
            stored_ids = set(found["ids"])
            wanted = planned[source.path]
            new_chunks.extend(c for c in wanted if c.chunk_id not in stored_ids)
            kept[source.path] = [str(c.chunk_id) for c in wanted if c.chunk_id in stored_ids]
            stale.extend(stored_ids - {str(c.chunk_id) for c in wanted})
        self._add(new_chunks, on_progress)
        for source in changed:  # kept chunks now belong to the new version of their file
            ids = kept[source.path]
            by_id = {str(c.chunk_id): c for c in planned[source.path]}
            for batch in _batches(ids):
                self.collection.update(ids=batch, metadatas=[by_id[i].metadata for i in batch])
        for batch in _batches(stale):
            self.collection.delete(ids=batch)
        with_text = [source for source in sources if source.documents]
        report = IngestReport(
            num_files=len(with_text),
            num_files_unchanged=sum(1 for source in with_text if source not in changed),
            num_chunks_kept=sum(len(ids) for ids in kept.values()),
            num_chunks_removed=len(stale),
            added=tuple(new_chunks),
            sources=tuple(str(source.path) for source in sources),
            empty=tuple(
                SkippedFile(source.path, source.empty_reason or "holds no text")
                for source in sources
                if not source.documents
            ),
        )
        logger.info(
            "ingested %d files (%d unchanged): %d chunks added, %d kept, %d removed",
            report.num_files,
            report.num_files_unchanged,
            len(report.added),
            report.num_chunks_kept,
            report.num_chunks_removed,
        )
        return report

    def prune_missing_sources(self) -> dict[str, int]:
        """Remove the chunks of ingested files that no longer exist; returns chunks per file.

        Only chunks that came from files (``ingest``) are considered; chunks added as text
        (``add_chunks``) are kept. Their KV stays in the KV store until evicted; it is never
        retrieved again.
        """
        stored = self.collection.get(include=["metadatas"])
        gone: dict[str, list[str]] = {}
        for chunk_id, metadata in zip(stored["ids"], stored["metadatas"], strict=True):
            if not metadata or "file_sha256" not in metadata:
                continue  # added as text, not from a file
            source = str(metadata.get("source", ""))
            if source and not Path(source).exists():
                gone.setdefault(source, []).append(chunk_id)
        for source, ids in gone.items():
            for batch in _batches(ids):
                self.collection.delete(ids=batch)
            logger.info("pruned %d chunks of %s (the file no longer exists)", len(ids), source)
        return {source: len(ids) for source, ids in gone.items()}

    def sources(self) -> dict[str, int]:
        """Each ``source`` the stored chunks name (a file's path), with its number of chunks."""
        stored = self.collection.get(include=["metadatas"])
        counts: Counter[str] = Counter(
            str((metadata or {}).get("source", "")) for metadata in stored["metadatas"]
        )
        return dict(counts)

    def count_source(self, source: str) -> int:
        """Chunks stored of ``source``."""
        return len(self.collection.get(where={"source": source}, include=[])["ids"])

    def remove_source(self, source: str) -> int:
        """Remove every chunk of ``source`` (as :meth:`sources` names it); returns how many.

        Its KV stays in the KV store until evicted; it is never retrieved again.
        """
        ids = self.collection.get(where={"source": source}, include=[])["ids"]
        for batch in _batches(ids):
            self.collection.delete(ids=batch)
        logger.info("removed %d chunks of %s", len(ids), source)
        return len(ids)

    def add_chunks(self, chunks: Sequence[Chunk], source: str = "memory") -> list[Chunk]:
        """Store chunks given as text (ids from their content); returns the ones not yet stored.

        Raises:
            InputError: A chunk's text is empty or not valid Unicode (nothing is stored then).
        """
        if not chunks:
            return []
        for idx, chunk in enumerate(chunks):
            _check_chunk_text(chunk.text, idx)
        counts: Counter[str] = Counter()
        with_ids = []
        for chunk in chunks:
            counts[chunk.text] += 1
            chunk_id = chunk.chunk_id or content_chunk_id(
                source, "", counts[chunk.text], chunk.text
            )
            metadata = {"source": source, **chunk.metadata}
            with_ids.append(Chunk(chunk.text, chunk_id, None, metadata))
        found = self.collection.get(ids=[str(c.chunk_id) for c in with_ids], include=[])
        stored = set(found["ids"])
        new = [c for c in with_ids if c.chunk_id not in stored]
        self._add(new, None)
        return new

    # --- internals

    def _remove_if_new_and_empty(self) -> None:
        """Remove the collection this knowledge base made, after a failed ingest stored nothing.

        The next use makes it again.
        """
        if not self._is_new or self.count() > 0:
            return
        self._client.delete_collection(self.config.collection)
        self._collection = self._retriever = None
        self._is_new = True
        logger.info("removed the empty collection %r again", self.config.collection)

    def _holds(self, source: SourceFile) -> bool:
        """The collection holds every chunk of this exact file version and nothing else of it.

        A run stopped midway (adds done, stale chunks not yet removed, or only some batches
        added) fails this check, so the next run finishes the job.
        """
        found = self.collection.get(where={"source": str(source.path)}, include=["metadatas"])
        metadatas = found["metadatas"] or []
        if not metadatas:
            return not source.documents
        expected = metadatas[0].get("file_num_chunks")
        same_version = all(
            m.get("file_sha256") == source.sha256
            and m.get("splitter", "tokens") == self.splitter_name  # else re-split it
            for m in metadatas
        )
        return same_version and expected == len(metadatas)

    def _add(self, chunks: Sequence[Chunk], on_progress: ProgressCallback | None) -> None:
        batch_size = self.config.embedding_batch_size
        by_length = sorted(chunks, key=lambda chunk: len(chunk.text))  # less padding per batch
        for start in range(0, len(by_length), batch_size):
            batch = by_length[start : start + batch_size]
            self.collection.add(
                ids=[str(c.chunk_id) for c in batch],
                embeddings=self.embedder.embed_documents([c.text for c in batch]),  # type: ignore[arg-type]
                documents=[c.text for c in batch],
                metadatas=[c.metadata for c in batch],  # type: ignore[arg-type]
            )
            if on_progress is not None:
                on_progress(start + len(batch), len(chunks))


def _collection_names(client: Any) -> list[str]:
    """The names of the client's collections, sorted."""
    return sorted(getattr(c, "name", c) for c in client.list_collections())


def _batches(ids: Sequence[str]) -> Iterable[list[str]]:
    """``ids`` in slices Chroma accepts in one call (its limit is 5,461 with SQLite)."""
    for start in range(0, len(ids), WRITE_BATCH_SIZE):
        yield list(ids[start : start + WRITE_BATCH_SIZE])


def _check_chunk_text(text: object, idx: int) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"chunk {idx} has no text; pass non-empty strings")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(
            f"chunk {idx} holds a lone surrogate U+{ord(text[err.start]):04X} at character "
            f"{err.start}, which is not valid Unicode; remove it"
        ) from None
