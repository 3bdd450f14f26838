"""Reading source files into documents, and splitting documents into token-sized chunks.

A source file is a text or markdown file (one document) or a JSONL file of passages (one
document per passage: ``{"text", "title"?, "id"?}``, or a QA record with ``passages: [...]``).
Chunks are windows of ``chunk_tokens`` model tokens with ``overlap_tokens`` shared between
neighbours, cut at token boundaries of the original text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.errors import InputError
from adarag.schema import Chunk

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".text"})
JSONL_SUFFIXES = frozenset({".jsonl"})

TokenSpans = Callable[[str], Sequence[tuple[int, int]]]
"""Character ``(start, end)`` of each model token of a text, in order."""


@dataclass(frozen=True)
class SourceDocument:
    """One document of a source file.

    Attributes:
        text: The document's body.
        key: Unique within its file: ``""`` for a text file, the passage id for JSONL.
        title: A title line put before each of its chunks, or None.
    """

    text: str
    key: str
    title: str | None = None


@dataclass(frozen=True)
class SourceFile:
    """A file to ingest: its resolved path, content hash and documents."""

    path: Path
    sha256: str
    documents: tuple[SourceDocument, ...]


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files named by ``paths``, directories expanded to their text, markdown and JSONL files.

    Raises:
        InputError: A path does not exist, or a directory holds no such file.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES | JSONL_SUFFIXES
            )
            if not found:
                raise InputError(f"directory {path} holds no .txt, .md or .jsonl files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path} does not exist; pass text, markdown or JSONL files")
    return [file.resolve() for file in dict.fromkeys(files)]


def read_source_file(path: Path) -> SourceFile:
    """Read one file into documents.

    Raises:
        InputError: The file is not UTF-8 text, or a JSONL line is not a passage.
    """
    data = path.read_bytes()
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path} is not UTF-8 text; pass text, markdown or JSONL files") from err
    digest = hashlib.sha256(data).hexdigest()
    if path.suffix.lower() in JSONL_SUFFIXES:
        documents: list[SourceDocument] = []
        for line_no, line in enumerate(content.splitlines(), start=1):
            if line.strip():
                record = _json_line(line, path, line_no)
                documents.extend(_passages(record, f"{line_no}", path))
        return SourceFile(path, digest, tuple(documents))
    document = SourceDocument(content, key="") if content.strip() else None
    return SourceFile(path, digest, (document,) if document else ())


def passage_text(text: str, title: str | None = None) -> str:
    """A passage as it goes into a prompt: its title line (when it has one), then its text."""
    return f"{title}\n{text}" if title else text


def read_passages(paths: Iterable[str | Path]) -> list[Chunk]:
    """Every document of ``paths`` (files or folders) as one chunk, title line first.

    Raises:
        InputError: A path is missing or unreadable, or a JSONL line is not a passage.
    """
    chunks = []
    for path in expand_paths(paths):
        for document in read_source_file(path).documents:
            metadata: dict[str, Any] = {"source": str(path), "document_key": document.key}
            if document.title:
                metadata["title"] = document.title
            chunk_id = f"{path}#{document.key}" if document.key else str(path)
            text = passage_text(document.text, document.title)
            chunks.append(Chunk(text, chunk_id=chunk_id, metadata=metadata))
    return chunks


def split_by_tokens(
    text: str, token_spans: TokenSpans, chunk_tokens: int, overlap_tokens: int
) -> list[str]:
    """Windows of ``chunk_tokens`` tokens of ``text``, neighbours sharing ``overlap_tokens``.

    Each window is the original text from its first token's start to its last token's end.
    """
    assert 0 <= overlap_tokens < chunk_tokens, f"overlap {overlap_tokens} >= {chunk_tokens}"
    spans = list(token_spans(text))
    if not spans:
        return [text.strip()] if text.strip() else []
    stride = chunk_tokens - overlap_tokens
    chunks: list[str] = []
    for start_idx in range(0, len(spans), stride):
        end_idx = min(start_idx + chunk_tokens, len(spans))
        piece = text[spans[start_idx][0] : spans[end_idx - 1][1]].strip()
        if piece:
            chunks.append(piece)
        if end_idx == len(spans):
            break
    return chunks


def tokenizer_spans(tokenizer: Any) -> TokenSpans:
    """:data:`TokenSpans` of a Hugging Face fast tokenizer (offsets, no special tokens)."""

    def spans(text: str) -> list[tuple[int, int]]:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"]]

    return spans


def _json_line(line: str, path: Path, line_no: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{line_no} is not valid JSON: {err}") from err
    if not isinstance(record, dict):
        raise InputError(f"{path}:{line_no} is not a JSON object")
    return record


def _passages(record: dict[str, Any], where: str, path: Path) -> list[SourceDocument]:
    if isinstance(record.get("text"), str):
        title = record.get("title")
        key = str(record.get("id", where))
        return [SourceDocument(record["text"], key, title if isinstance(title, str) else None)]
    if isinstance(record.get("passages"), list):
        return [
            document
            for idx, passage in enumerate(record["passages"])
            for document in _passages(passage, f"{where}#{idx}", path)
        ]
    raise InputError(f"{path}:{where}: a JSONL line needs a 'text' or a 'passages' field")
