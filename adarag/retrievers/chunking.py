"""Reading source files into documents, and splitting documents into token-sized chunks.

A source file is a text or markdown file (one document), a JSONL file of passages (one
document per passage: ``{"text", "title"?, "id"?}``, or a QA record with ``passages: [...]``),
or a PDF, HTML, Word or CSV file (:mod:`adarag.retrievers.readers`).
Chunks are windows of ``chunk_tokens`` model tokens with ``overlap_tokens`` shared between
neighbours, cut at token boundaries of the original text.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from adarag.errors import InputError
from adarag.retrievers.file_types import JSONL_SUFFIXES, SUPPORTED_SUFFIXES
from adarag.retrievers.paths import path_kind, scan_paths
from adarag.retrievers.readers import READERS, decode_text
from adarag.retrievers.sources import MARKDOWN_SUFFIXES, SourceDocument, SourceFile
from adarag.schema import Chunk

READABLE_SUFFIXES = SUPPORTED_SUFFIXES
"""The suffixes of the files ingest reads (:data:`.file_types.SUPPORTED_SUFFIXES`)."""
NO_TEXT = "holds no text"
EMPTY_REASONS = {
    ".pdf": "no text layer: a scanned PDF needs text recognition (OCR) first",
}
"""Why a file of this suffix gives no document, when it gives none (else :data:`NO_TEXT`)."""
_FIX = "pass text, markdown, JSONL, PDF, HTML, Word (.docx) or CSV files"

TokenSpans = Callable[[str], Sequence[tuple[int, int]]]
"""Character ``(start, end)`` of each model token of a text, in order."""


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """The files ``paths`` name, folders expanded to the files ingest reads (see :mod:`.paths`).

    Raises:
        InputError: A path does not exist, is a link loop or a broken link, is not a regular
            file or folder (a FIFO, a device, a socket), or a folder holds no file to read.
    """
    return list(scan_paths(paths, READABLE_SUFFIXES).files)


def read_source_file(
    path: Path, *, max_file_bytes: int | None = None, max_line_chars: int | None = None
) -> SourceFile:
    """Read one file into documents.

    Args:
        path: The file.
        max_file_bytes: A larger file is refused before it is read (None: no bound).
        max_line_chars: A file with a longer line is refused (None: no bound).

    Raises:
        InputError: The file cannot be read, is not a regular file (a FIFO or a device is never
            read from), is larger than ``max_file_bytes``, is not UTF-8 text, holds NUL bytes
            (binary), has a line longer than ``max_line_chars``, or a JSONL line is not a
            passage.
    """
    data = _read_regular_file(path, max_file_bytes)
    digest = hashlib.sha256(data).hexdigest()
    suffix = path.suffix.lower()
    if suffix in READERS:
        reader, has_headings = READERS[suffix]
        read = reader(path, data, max_file_bytes)
        if max_line_chars is not None:
            for read_document in read:
                _check_line_lengths(read_document.text, path, max_line_chars)
        empty = None if read else EMPTY_REASONS.get(suffix, NO_TEXT)
        return SourceFile(path, digest, tuple(read), has_headings, True, empty)
    content = decode_text(data, path)
    if max_line_chars is not None:
        _check_line_lengths(content, path, max_line_chars)
    if path.suffix.lower() in JSONL_SUFFIXES:
        documents: list[SourceDocument] = []
        # Only "\n" ends a JSONL line: str.splitlines() would also split at U+2028 and other
        # separators that JSON allows raw inside strings.
        for line_no, line in enumerate(content.removeprefix("\ufeff").split("\n"), start=1):
            if line.strip():
                record = _json_line(line, path, line_no)
                try:
                    documents.extend(_passages(record, f"{line_no}", path))
                except RecursionError:
                    raise InputError(
                        f"{path}:{line_no}: its passages nest too deeply; pass flat passages"
                    ) from None
        empty = None if documents else NO_TEXT
        return SourceFile(path, digest, tuple(documents), empty_reason=empty)
    document = SourceDocument(content, key="") if content.strip() else None
    has_headings = suffix in MARKDOWN_SUFFIXES
    if document is None:
        return SourceFile(path, digest, (), has_headings, empty_reason=NO_TEXT)
    return SourceFile(path, digest, (document,), has_headings)


def _check_line_lengths(content: str, path: Path, max_line_chars: int) -> None:
    """Refuse a text with a line over ``max_line_chars`` (one linear pass)."""
    start = 0
    line_no = 1
    while start <= len(content):
        end = content.find("\n", start)
        end = len(content) if end < 0 else end
        if end - start > max_line_chars:
            raise InputError(
                f"{path}:{line_no}: a line of {end - start} characters, longer than "
                f"retrieval.max_line_chars={max_line_chars}; break the line, or raise the setting"
            )
        start = end + 1
        line_no += 1


def _read_regular_file(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path``, refusing anything but a regular file without blocking on it.

    The file is opened non-blocking and checked with ``fstat`` before a byte is read, so a FIFO
    never blocks the open and ``/dev/zero`` is never read forever; a file over ``max_bytes``
    (None: no bound) is refused, and at most one byte past the bound is ever read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        kind = path_kind(path)
        why = kind if kind not in ("file", "directory") else f"cannot be read ({err.strerror})"
        if err.errno == errno.EACCES:
            why = "cannot be read (permission denied); check its permissions"
        raise InputError(f"{path} {why}; {_FIX}") from err
    except ValueError as err:  # an embedded NUL character
        raise InputError(f"{path!r} is not a valid path (it holds a NUL); {_FIX}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise InputError(f"{path} is {kind}; {_FIX}")
        too_large = InputError(
            f"{path} is larger than retrieval.max_file_bytes={max_bytes}; split it into smaller "
            "files, or raise the setting"
        )
        if max_bytes is not None and os.fstat(fd).st_size > max_bytes:
            raise too_large
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise too_large  # it grew while it was read
        return data
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror or err}; {_FIX}") from err
    finally:
        if fd >= 0:
            os.close(fd)


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
            metadata: dict[str, Any] = {
                "source": str(path),
                "document_key": document.key,
                **document.metadata,
            }
            if document.title:
                metadata["title"] = document.title
            chunk_id = f"{path}#{document.key}" if document.key else str(path)
            text = passage_text(document.text, document.title)
            chunks.append(Chunk(text, chunk_id=chunk_id, metadata=metadata))
    return chunks


def split_by_tokens(
    text: str,
    token_spans: TokenSpans,
    chunk_tokens: int,
    overlap_tokens: int,
    spans: Sequence[tuple[int, int]] | None = None,
) -> list[str]:
    """Windows of at most ``chunk_tokens`` tokens of ``text``, cut between words.

    A window ends before the last token within its budget that starts a word (so "Marta
    Kowalski" is never cut inside a name); neighbours share about ``overlap_tokens`` tokens,
    the next window also starting at a word. Only a single word longer than the budget is cut
    inside. Each window is the original text from its first token's start to its last token's
    end. ``spans``: the text's token spans when the caller has them (else ``token_spans(text)``).
    """
    assert 0 <= overlap_tokens < chunk_tokens, f"overlap {overlap_tokens} >= {chunk_tokens}"
    spans = list(token_spans(text)) if spans is None else spans
    if not spans:
        return [text.strip()] if text.strip() else []

    def starts_word(idx: int) -> bool:  # asked only near window ends: linear in the windows
        return idx == 0 or _after_space(text, spans[idx][0])

    num_tokens = len(spans)
    chunks: list[str] = []
    start = 0
    while start < num_tokens:
        end = min(start + chunk_tokens, num_tokens)
        if end < num_tokens:
            cut = end
            while cut > start + 1 and not starts_word(cut):
                cut -= 1
            end = cut if starts_word(cut) else end  # no word boundary: one over-long word
        piece = text[spans[start][0] : spans[end - 1][1]].strip()
        if piece:
            chunks.append(piece)
        if end == num_tokens:
            break
        next_start = max(end - overlap_tokens, start + 1)
        while next_start < end and not starts_word(next_start):
            next_start += 1
        start = next_start
    return chunks


def _after_space(text: str, offset: int) -> bool:
    """Whether a token starting at ``offset`` starts a word (whitespace at or before it)."""
    return text[offset : offset + 1].isspace() or text[offset - 1 : offset].isspace()


def tokenizer_spans(tokenizer: Any) -> TokenSpans:
    """:data:`TokenSpans` of a Hugging Face fast tokenizer (offsets, no special tokens)."""

    def spans(text: str) -> list[tuple[int, int]]:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"]]

    return spans


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_line(line: str, path: Path, line_no: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except RecursionError:
        raise InputError(
            f"{path}:{line_no} nests JSON too deeply; write one flat JSON object per line"
        ) from None
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}:{line_no} is not valid JSON ({err.msg} at column {err.colno}); write one "
            "JSON object per line"
        ) from err
    except ValueError as err:  # e.g. an integer longer than Python's conversion limit
        raise InputError(
            f"{path}:{line_no} is not usable JSON ({err}); write one JSON object per line"
        ) from err
    if not isinstance(record, dict):
        raise InputError(
            f"{path}:{line_no} is a JSON {_json_type(record)}, not an object; write one JSON "
            'object per line, e.g. {"text": "..."}'
        )
    return record


def _passages(record: Any, where: str, path: Path) -> list[SourceDocument]:
    if not isinstance(record, dict):
        raise InputError(
            f"{path}:{where}: a passage is a JSON {_json_type(record)}, not an object; write "
            'passages as {"text": "..."}'
        )
    if "text" in record:
        text, title = record["text"], record.get("title")
        if not isinstance(text, str):
            raise InputError(
                f"{path}:{where}: 'text' is a JSON {_json_type(text)}, not a string; "
                "give each passage its text as a string"
            )
        if title is not None and not isinstance(title, str):
            raise InputError(
                f"{path}:{where}: 'title' is a JSON {_json_type(title)}, not a string; "
                "give the title as a string or leave it out"
            )
        for field, value in (("text", text), ("title", title or "")):
            found = _LONE_SURROGATE.search(value)
            if found is not None:
                raise InputError(
                    f"{path}:{where}: '{field}' holds a lone surrogate "
                    f"U+{ord(found.group()):04X} (a bad \\u escape), which is not valid "
                    "Unicode; fix or remove the escape"
                )
        key = str(record.get("id", where))
        return [SourceDocument(text, key, title)]
    if "passages" in record:
        passages = record["passages"]
        if not isinstance(passages, list):
            raise InputError(
                f"{path}:{where}: 'passages' is a JSON {_json_type(passages)}, not a list; "
                'give a list of {"text": "..."} objects'
            )
        return [
            document
            for idx, passage in enumerate(passages)
            for document in _passages(passage, f"{where}#{idx}", path)
        ]
    raise InputError(
        f"{path}:{where}: a JSONL line needs a 'text' or a 'passages' field; write passages as "
        '{"text": "...", "title": "..."}'
    )


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
