"""A source file's chunks as the knowledge base stores them: text, content-hashed id, metadata.

A converted file's (HTML, Word) headings are plain lines in its chunks; each chunk records its
heading path in its metadata.

Each chunk's id hashes its file, document key, occurrence and text, so a chunk whose text is
unchanged keeps its id (and its KV) when its file is ingested again. Every chunk records its
file's SHA-256, its file's chunk count and the splitter that cut it, from which the knowledge
base tells a file stored as is from one to ingest again.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from adarag.config import RetrievalConfig
from adarag.retrievers.chunking import TokenSpans, passage_text
from adarag.retrievers.external_splitter import ExternalSplitter
from adarag.retrievers.sources import SourceDocument, SourceFile
from adarag.retrievers.splitting import atx_heading, split_document
from adarag.schema import Chunk


def plan_chunks(
    source: SourceFile,
    config: RetrievalConfig,
    spans: TokenSpans,
    splitter: ExternalSplitter | None = None,
) -> list[Chunk]:
    """The chunks of ``source``, cut by ``splitter`` (None: ``config.splitter``)."""
    pieces: list[tuple[SourceDocument, str, str | None]] = []  # (document, text, heading)
    for document in source.documents:
        for heading, text in _split(document, source, config, spans, splitter):
            shown = _unmarked(text) if source.converted else text
            pieces.append((document, passage_text(shown, document.title), heading))
    name = splitter.name if splitter is not None else config.splitter
    counts: Counter[tuple[str, str]] = Counter()
    chunks = []
    for chunk_idx, (document, text, heading) in enumerate(pieces):
        counts[(document.key, text)] += 1
        metadata: dict[str, Any] = {
            "source": str(source.path),
            "file_sha256": source.sha256,
            "file_num_chunks": len(pieces),
            "chunk_idx": chunk_idx,
            "document_key": document.key,
            "splitter": name,
            **document.metadata,
        }
        if document.title:
            metadata["title"] = document.title
        if heading:
            metadata["heading"] = heading
        occurrence = counts[(document.key, text)]
        chunk_id = content_chunk_id(str(source.path), document.key, occurrence, text)
        chunks.append(Chunk(text, chunk_id=chunk_id, metadata=metadata))
    return chunks


def _split(
    document: SourceDocument,
    source: SourceFile,
    config: RetrievalConfig,
    spans: TokenSpans,
    splitter: ExternalSplitter | None,
) -> list[tuple[str | None, str]]:
    if splitter is not None:
        return splitter.split_document(document.text, has_headings=source.has_headings)
    budget = config.chunk_tokens
    if document.title:
        budget = max(budget - len(spans(document.title + "\n")), 16)
    overlap = min(config.chunk_overlap_tokens, budget - 1)
    return split_document(
        document.text,
        source.path,
        config.splitter,
        spans,
        budget,
        overlap,
        has_headings=source.has_headings,
    )


def _unmarked(text: str) -> str:
    """``text`` with each heading line as its plain title: ``## Install`` becomes ``Install``."""
    lines = []
    for line in text.split("\n"):
        heading = atx_heading(line)
        lines.append(heading[1] if heading is not None else line)
    return "\n".join(lines)


def content_chunk_id(source: str, key: str, occurrence: int, text: str) -> str:
    """The id of the ``occurrence``-th chunk with ``text`` in document ``key`` of ``source``."""
    digest = hashlib.sha256(f"{source}\x00{key}\x00{occurrence}\x00{text}".encode())
    return digest.hexdigest()[:32]
