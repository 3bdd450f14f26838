"""The files an ingest reads, and every file it does not, each with its reason.

A folder's files that cannot be read (a damaged or encrypted PDF, a binary file with a text
suffix) are left out and named, as its files of other types are, so one bad file never stops
the rest of the folder; a file given by name that cannot be read is an error, as is a file
given by name of a type ingest does not read. A file read without any text (a scanned PDF) is
named as empty with its reason. ``strict`` makes any of these an error, naming them all, before
anything is stored.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from adarag.config import RetrievalConfig
from adarag.errors import InputError
from adarag.retrievers.chunking import read_source_file
from adarag.retrievers.file_types import (
    SUPPORTED_SUFFIXES,
    is_supported,
    unsupported_type_message,
)
from adarag.retrievers.paths import (
    SkippedFile,
    describe_skipped,
    path_kind,
    scan_paths,
    shown_path,
)
from adarag.retrievers.sources import SourceFile


@dataclass(frozen=True)
class GatheredFiles:
    """What the paths given to an ingest hold.

    Attributes:
        sources: The files read (an empty one too: it may replace a version that had text).
        skipped: The files of the folders given that are not read (another type, hidden, not a
            regular file), each with the reason.
        unreadable: The files of the folders given that could not be read, each with the reason.
        empty: The files read without any text (a scanned PDF), each with the reason.
    """

    sources: tuple[SourceFile, ...]
    skipped: tuple[SkippedFile, ...] = ()
    unreadable: tuple[SkippedFile, ...] = ()
    empty: tuple[SkippedFile, ...] = ()

    @property
    def not_ingested(self) -> tuple[SkippedFile, ...]:
        """Every file named as skipped, unreadable or empty, in that order."""
        return self.skipped + self.unreadable + self.empty


def gather_files(
    paths: Iterable[str | Path], read: Callable[[Path], SourceFile], *, strict: bool = False
) -> GatheredFiles:
    """Read the files ``paths`` name (folders expanded), naming every one left out.

    Args:
        paths: Files and folders.
        read: Reads one file (``KnowledgeBase.read``), raising :class:`InputError` when it
            cannot.
        strict: Refuse when any file is skipped, unreadable or empty.

    Raises:
        InputError: A path is missing, a file given by name is of a type ingest does not read
            or cannot be read (every such file named), or (``strict``) a file is skipped,
            unreadable or empty (every one named).
    """
    paths = list(paths)
    check_named_types(paths)  # named as given
    scanned = scan_paths(paths, SUPPORTED_SUFFIXES)
    sources: list[SourceFile] = []
    unreadable: list[SkippedFile] = []
    errors: list[InputError] = []
    for path in scanned.files:
        try:
            sources.append(read(path))
        except InputError as err:
            unreadable.append(SkippedFile(path, _reason(err, path)))
            errors.append(err)
    named_unreadable = [item for item in unreadable if item.path in scanned.named]
    if named_unreadable and len(unreadable) == 1:
        raise errors[0]  # the one file's own error, as reading it alone gives
    if named_unreadable:
        raise InputError(
            f"{len(unreadable)} file(s) cannot be read: {describe_skipped(unreadable)}; fix them, "
            "or leave the ones given by name out"
        )
    empty = [
        SkippedFile(source.path, source.empty_reason or "holds no text")
        for source in sources
        if not source.documents
    ]
    gathered = GatheredFiles(tuple(sources), scanned.skipped, tuple(unreadable), tuple(empty))
    if strict and gathered.not_ingested:
        left_out = gathered.not_ingested
        raise InputError(
            f"{len(left_out)} file(s) are not read or hold no text: {describe_skipped(left_out)}; "
            "fix them or move them out, or turn strict (--strict) off"
        )
    return gathered


def read_file(path: Path, config: RetrievalConfig) -> SourceFile:
    """One file read into documents under ``config``'s limits (``KnowledgeBase.read``).

    Raises:
        InputError: Its name is not UTF-8, it is larger than ``max_file_bytes``, has a line over
            ``max_line_chars``, or cannot be read as its type.
    """
    _check_file_name(path)
    return read_source_file(
        path, max_file_bytes=config.max_file_bytes, max_line_chars=config.max_line_chars
    )


def check_named_types(paths: Iterable[str | Path]) -> None:
    """Refuse a file given by name whose type ingest does not read (folders pass).

    Raises:
        InputError: Naming the file, its type and the types ingest reads.
    """
    for path in paths:
        if path_kind(Path(path)) == "file" and not is_supported(path):
            raise InputError(unsupported_type_message(shown_path(Path(path))))


def _check_file_name(path: Path) -> None:
    """Refuse a path that is not valid UTF-8 (Chroma stores the source name as text).

    Raises:
        InputError: Naming the file (undecodable bytes escaped) and the fix.
    """
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", errors="backslashreplace")
        raise InputError(
            f"{shown}: the file name is not valid UTF-8, which the knowledge base cannot store; "
            "rename the file (e.g. `convmv -f latin1 -t utf-8`)"
        ) from None


def _reason(err: InputError, path: Path) -> str:
    """The error's message without the path it starts with (``"an encrypted PDF; ..."``)."""
    message = str(err)
    for prefix in (str(path), shown_path(path)):
        if message.startswith(prefix):
            return message.removeprefix(prefix).lstrip(": ").removeprefix("is ") or message
    return message
