"""Which files the paths given to ingest name: folders expanded, every file left out named.

Inside a folder, only regular files (or links to them within the folder) whose suffix a reader
takes are read. Everything else the folder holds is left out and named with the reason: a hidden
file or folder (a name starting with ``.``; a hidden folder is named once, its content is not
walked), another type, a FIFO, a device, a socket, a broken or looping link, a link leading out
of the folder (a folder's content is what is inside it), a link to a folder (not followed). A
path given by name is taken whatever its suffix or name (ingest refuses another type:
:mod:`adarag.retrievers.gathering`); one that is not a regular file or a folder is an error.
"""

from __future__ import annotations

import errno
import logging
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from adarag.errors import InputError
from adarag.retrievers.file_types import (
    HIDDEN_FILE_REASON,
    HIDDEN_FOLDER_REASON,
    is_hidden,
    unsupported_type_reason,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedFile:
    """A file ingest does not read, and why (``"unsupported type .xyz"``)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{shown_path(self.path)} ({self.reason})"


@dataclass(frozen=True)
class ScannedPaths:
    """The files to read (resolved, each once) and the files of the folders that are not.

    Attributes:
        files: The files to read, resolved, each once.
        skipped: The files (and hidden folders) of the folders given that are not read.
        named: The ``files`` given by name rather than found in a folder.
    """

    files: tuple[Path, ...]
    skipped: tuple[SkippedFile, ...]
    named: frozenset[Path] = frozenset()


def scan_paths(paths: Iterable[str | Path], suffixes: Collection[str]) -> ScannedPaths:
    """The files ``paths`` name, folders expanded to their files with one of ``suffixes``.

    A file named twice (also through a link or a ``..`` path) is taken once.

    Args:
        paths: Files and folders.
        suffixes: The lower-case suffixes (``".md"``) taken from folders.

    Raises:
        InputError: A path does not exist, is a link loop or a broken link, is not a regular
            file or folder (a FIFO, a device, a socket), or a folder holds no file to read.
    """
    files: list[tuple[Path, bool]] = []  # (file, given by name)
    skipped: list[SkippedFile] = []
    for raw in paths:
        path = Path(raw).expanduser()
        kind = path_kind(path)
        if kind == "directory":
            found, left_out = _folder_files(path, suffixes)
            skipped.extend(left_out)
            files.extend((file, False) for file in found)
        elif kind == "file":
            files.append((path, True))
        else:
            raise InputError(f"{shown_path(path)} {kind}; pass files or folders of documents")
    resolved: dict[Path, None] = {}
    named: set[Path] = set()
    for file, by_name in files:
        try:
            resolved_file = file.resolve(strict=True)
        except (OSError, RuntimeError) as err:  # RuntimeError: a link loop (Python < 3.13)
            raise InputError(f"cannot resolve {file}: {err}; pass the file itself") from err
        resolved[resolved_file] = None
        if by_name:
            named.add(resolved_file)
    return ScannedPaths(tuple(resolved), tuple(skipped), frozenset(named))


def expand_paths(paths: Iterable[str | Path], suffixes: Collection[str]) -> list[Path]:
    """The files of :func:`scan_paths`, without the ones left out."""
    return list(scan_paths(paths, suffixes).files)


def _folder_files(folder: Path, suffixes: Collection[str]) -> tuple[list[Path], list[SkippedFile]]:
    """The files of ``folder`` to read, and the ones left out (sorted by path)."""
    found: list[Path] = []
    skipped: list[SkippedFile] = []
    try:
        entries = sorted(folder.rglob("*"))
    except OSError as err:
        raise InputError(
            f"cannot list directory {folder}: {err.strerror or err}; check its permissions"
        ) from err
    hidden_folders: list[Path] = []
    for entry in entries:
        if any(entry.is_relative_to(hidden) for hidden in hidden_folders):
            continue  # named once, as its hidden folder
        kind = path_kind(entry)
        if is_hidden(entry.name):
            if kind == "directory" and not entry.is_symlink():
                hidden_folders.append(entry)
            reason = HIDDEN_FOLDER_REASON if kind == "directory" else HIDDEN_FILE_REASON
            skipped.append(SkippedFile(entry, reason))
        elif kind == "directory":
            if entry.is_symlink():
                skipped.append(SkippedFile(entry, "a link to a folder, not followed"))
        elif kind != "file":
            skipped.append(SkippedFile(entry, kind.removeprefix("is ")))
        elif entry.suffix.lower() in suffixes:
            found.append(entry)
        else:
            skipped.append(SkippedFile(entry, unsupported_type_reason(entry)))
    inside = _inside(found, folder)
    kept = set(inside)
    skipped.extend(
        SkippedFile(file, "a link leading outside the folder") for file in found if file not in kept
    )
    if found and not inside:
        raise InputError(
            f"directory {folder} holds only links leading outside it, which are not followed; "
            "pass their targets (or the folder they are in) instead"
        )
    if not inside:
        held = f"; it holds {describe_skipped(skipped)}" if skipped else ""
        raise InputError(
            f"directory {folder} holds no file ingest reads ({', '.join(sorted(suffixes))}){held}; "
            "pass a folder of documents"
        )
    listed = [SkippedFile(item.path.absolute(), item.reason) for item in skipped]
    return inside, sorted(listed, key=lambda item: item.path)


def describe_skipped(skipped: Iterable[SkippedFile], limit: int = 20) -> str:
    """``"a.xyz (unsupported type), b.bin (unsupported type)"``; past ``limit``, how many more."""
    items = list(skipped)
    text = ", ".join(str(item) for item in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _inside(files: list[Path], directory: Path) -> list[Path]:
    """The ``files`` that resolve inside ``directory``; the others are left out with a warning."""
    root = directory.resolve()
    kept, outside = [], []
    for file in files:
        try:
            file.resolve(strict=True).relative_to(root)
        except ValueError:
            outside.append(file)
            continue
        except (OSError, RuntimeError):
            pass  # a broken or looping link: reported when it is resolved
        kept.append(file)
    if outside:
        logger.warning(
            "skipped %d link(s) in %s leading outside it (e.g. %s); pass their targets "
            "explicitly to ingest them",
            len(outside),
            directory,
            shown_path(outside[0]),
        )
    return kept


def shown_path(path: Path) -> str:
    """``path`` for a message: non-UTF-8 bytes escaped, a very long one shortened."""
    text = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text if len(text) <= 240 else f"{text[:120]}...{text[-80:]}"


def path_kind(path: Path) -> str:
    """``"file"``, ``"directory"``, or why the path is neither (the rest of a sentence)."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            if path.is_symlink():
                return "is a broken symbolic link"
            return "does not exist"
        if err.errno == errno.ENAMETOOLONG:
            return "is too long a path"
        return f"cannot be read ({err.strerror or err})"
    except ValueError:  # an embedded NUL character
        return "is not a valid path (it holds a NUL character)"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"
