"""Documents from PDF, Word, HTML and CSV files (the ``documents`` extra).

- **PDF** (pypdf): one document per page with text (``page`` in its chunks' metadata); a page
  without a text layer (a scan) gives none. Running headers and footers are dropped and the
  text NFKC-normalised (:mod:`adarag.retrievers.page_text`).
- **Word** ``.docx`` (python-docx): paragraphs and tables in order; ``Heading N`` paragraphs
  become markdown headings, list paragraphs ``- `` items, a table row its cells joined by
  `` | ``. The document's title is its core properties' title, else its ``Title`` paragraph.
- **HTML** (beautifulsoup4 with lxml): the page's text without markup
  (:mod:`adarag.retrievers.html_text`), its ``<title>`` the document's title.
- **CSV** / **TSV** (the standard library): one document per row, each cell preceded by its
  column's header (``price: 4``), the first row being the header.

A document reader gets the file's bytes after adarag's checks (a regular file, at most
``retrieval.max_file_bytes``); a Word file's unpacked size is bound by the same limit, and
HTML and CSV text must not hold NUL characters. Control characters a PDF or Word file's text
layer holds are removed.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adarag.errors import InputError, MissingDependencyError
from adarag.retrievers.html_text import html_to_markdown
from adarag.retrievers.page_text import clean_pages
from adarag.retrievers.sources import SourceDocument

DocumentReader = Callable[[Path, bytes, int | None], list[SourceDocument]]
"""Reads a file's bytes (its path for messages, the byte limit) into documents."""

_UNICODE_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_HEADING_STYLE = re.compile(r"heading ([1-6])", re.IGNORECASE)


def decode_text(data: bytes, path: Path) -> str:
    """``data`` as UTF-8 text.

    Raises:
        InputError: It is not UTF-8, or holds a NUL (a binary file).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path} is not UTF-8 text (bad byte at offset {err.start}); save it as UTF-8, or "
            "pass one of the types `adarag ingest --help` lists"
        ) from err
    check_no_nul(text, path, data.find(0))
    return text


def check_no_nul(text: str, path: Path, offset: int | None = None) -> None:
    """Refuse a text holding a NUL character: the file is binary, not text.

    Raises:
        InputError: Naming the file and the NUL's offset.
    """
    if "\x00" in text:
        where = offset if offset is not None and offset >= 0 else text.index("\x00")
        raise InputError(
            f"{path} looks binary (it holds a NUL byte at offset {where}); pass text, markdown, "
            "JSONL, PDF, HTML, Word (.docx) or CSV files"
        )


def read_pdf(path: Path, data: bytes, max_bytes: int | None) -> list[SourceDocument]:
    """One document per PDF page with text."""
    try:
        from pypdf import PdfReader
    except ImportError as err:
        raise MissingDependencyError("pypdf", "documents") from err
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise InputError(f"{path} is an encrypted PDF; save a copy without a password")
        pages = [page.extract_text() or "" for page in reader.pages]
    except InputError:
        raise
    except Exception as err:  # a damaged file fails anywhere inside the parser
        raise _unreadable(path, "a PDF", err) from err
    return [
        SourceDocument(text, key=f"page {number}", metadata={"page": number})
        for number, text in enumerate(clean_pages([_cleaned(page) for page in pages]), 1)
        if text.strip()
    ]


def read_docx(path: Path, data: bytes, max_bytes: int | None) -> list[SourceDocument]:
    """The Word document's paragraphs and tables as one document."""
    try:
        import docx
        from docx.table import Table
    except ImportError as err:
        raise MissingDependencyError("python-docx", "documents") from err
    _check_unpacked_size(path, data, max_bytes)
    lines: list[str] = []
    titles: list[str] = []
    try:
        document = docx.Document(io.BytesIO(data))
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                lines.extend(_table_lines(block))
            elif block.style is not None and block.style.name == "Title":
                titles.append(block.text)
            else:
                lines.append(_paragraph_line(block))
        title = document.core_properties.title or " ".join(titles)
    except Exception as err:  # a damaged file fails anywhere inside the parser
        raise _unreadable(path, "a Word (.docx) document", err) from err
    text = _cleaned("\n".join(line for line in lines if line.strip()))
    return [SourceDocument(text, key="", title=_cleaned(title).strip() or None)] if text else []


def read_html(path: Path, data: bytes, max_bytes: int | None) -> list[SourceDocument]:
    """The page's text, headings as markdown headings (no scripts, styles or markup)."""
    try:
        from bs4.dammit import UnicodeDammit
    except ImportError as err:
        raise MissingDependencyError("beautifulsoup4", "documents") from err
    if not data.startswith(_UNICODE_BOMS):  # only UTF-16 and UTF-32 text holds NUL bytes
        check_no_nul(data.decode("latin-1"), path)
    markup = UnicodeDammit(data, is_html=True).unicode_markup
    if markup is None:
        raise InputError(f"{path}: its character encoding is not recognised; save it as UTF-8")
    check_no_nul(markup, path)
    title, text = html_to_markdown(markup)
    return [SourceDocument(text, key="", title=title)] if text.strip() else []


def read_csv(path: Path, data: bytes, max_bytes: int | None) -> list[SourceDocument]:
    """One document per row: ``header: value`` lines of its non-empty cells."""
    text = decode_text(data, path).removeprefix("\ufeff")
    if path.suffix.lower() == ".tsv":
        dialect: Any = csv.excel_tab
    else:
        try:
            dialect = csv.Sniffer().sniff(text[:65536], delimiters=",;\t|")
        except csv.Error:
            dialect = csv.excel
    rows = csv.reader(io.StringIO(text, newline=""), dialect)
    documents: list[SourceDocument] = []
    try:
        header = [cell.strip() for cell in next(rows, [])]
        for row_number, row in enumerate(rows, 1):
            names = header + [f"column {idx}" for idx in range(len(header) + 1, len(row) + 1)]
            cells = [
                f"{name or f'column {idx}'}: {value.strip()}"
                for idx, (name, value) in enumerate(zip(names, row, strict=False), 1)
                if value.strip()
            ]
            if cells:
                documents.append(
                    SourceDocument(
                        "\n".join(cells), key=f"row {row_number}", metadata={"row": row_number}
                    )
                )
    except csv.Error as err:
        raise InputError(
            f"{path}:{rows.line_num}: not readable as CSV ({err}); check its quoting"
        ) from err
    return documents


READERS: dict[str, tuple[DocumentReader, bool]] = {
    ".pdf": (read_pdf, False),
    ".docx": (read_docx, True),
    ".html": (read_html, True),
    ".htm": (read_html, True),
    ".xhtml": (read_html, True),
    ".csv": (read_csv, False),
    ".tsv": (read_csv, False),
}
"""Suffix -> (reader, whether its documents carry markdown headings)."""


def _paragraph_line(paragraph: Any) -> str:
    """A Word paragraph as a line: a heading, a list item or plain text."""
    text = " ".join(paragraph.text.split())
    style = str(paragraph.style.name if paragraph.style is not None else "")
    heading = _HEADING_STYLE.fullmatch(style)
    if text and heading:
        return f"{'#' * int(heading.group(1))} {text}"
    if text and style.startswith("List"):
        return f"- {text}"
    return text


def _table_lines(table: Any) -> list[str]:
    """Each row's distinct cells joined by `` | `` (a merged cell is listed once)."""
    lines = []
    for row in table.rows:
        cells = list(dict.fromkeys(" ".join(cell.text.split()) for cell in row.cells))
        lines.append(" | ".join(cell for cell in cells if cell))
    return lines


def _check_unpacked_size(path: Path, data: bytes, max_bytes: int | None) -> None:
    """Refuse a Word file that unpacks to more than ``max_bytes`` (a zip bomb)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, ValueError) as err:
        raise _unreadable(path, "a Word (.docx) document", err) from err
    if max_bytes is not None and unpacked > max_bytes:
        raise InputError(
            f"{path} unpacks to {unpacked} bytes, more than retrieval.max_file_bytes={max_bytes}; "
            "split it into smaller files, or raise the setting"
        )


def _unreadable(path: Path, kind: str, err: BaseException) -> InputError:
    reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    return InputError(f"{path} cannot be read as {kind} ({reason}); check that the file is whole")


def _cleaned(text: str | None) -> str:
    """Text from a binary format without control characters (kept: tab and newline)."""
    return _CONTROL.sub("", (text or "").replace("\r\n", "\n").replace("\r", "\n"))
