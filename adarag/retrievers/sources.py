"""What a file to ingest reads into: its documents, each with its text, key and title."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
"""Files whose ATX headings (``#`` to ``######``) cut them into sections."""


@dataclass(frozen=True)
class SourceDocument:
    """One document of a source file.

    Attributes:
        text: The document's body.
        key: Unique within its file: ``""`` for a text file, the passage id for JSONL, the
            page (``"page 3"``) of a PDF, the row (``"row 12"``) of a CSV file.
        title: A title line put before each of its chunks, or None.
        metadata: Stored with each of its chunks (a PDF page's ``page``, a CSV row's ``row``).
    """

    text: str
    key: str
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceFile:
    """A file to ingest: its resolved path, content hash and documents.

    Attributes:
        path: The file, resolved.
        sha256: The hash of its bytes.
        documents: What it holds, in order.
        has_headings: Its documents mark sections with markdown headings (a markdown file, or
            an HTML or Word file converted), which the ``markdown`` splitter cuts at.
        converted: Its documents were converted from another format (PDF, Word, HTML, CSV):
            the heading marks are not the file's, so chunks show each heading as a plain line.
        empty_reason: Why it gave no document, for the user (a scanned PDF has no text
            layer); None when it has documents.
    """

    path: Path
    sha256: str
    documents: tuple[SourceDocument, ...]
    has_headings: bool = False
    converted: bool = False
    empty_reason: str | None = None
