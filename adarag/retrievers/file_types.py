"""The files ingest reads: one list of types and one set of messages for every entry point.

``adarag ingest``, :meth:`KnowledgeBase.ingest <adarag.retrievers.KnowledgeBase.ingest>` and
documents sent to ``adarag serve`` take the same suffixes (:data:`SUPPORTED_SUFFIXES`), refuse
any other type with the same words (:func:`unsupported_type_message`) and leave hidden files
(a name starting with ``.``) out, as LlamaIndex's ``SimpleDirectoryReader`` does.
"""

from __future__ import annotations

from pathlib import PurePath

from adarag.retrievers.readers import READERS

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md", ".markdown", ".rst"})
JSONL_SUFFIXES = frozenset({".jsonl"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | JSONL_SUFFIXES | frozenset(READERS)
"""The lower-case suffixes of the files ingest reads (``".md"``)."""

HIDDEN_FILE_REASON = "a hidden file"
HIDDEN_FOLDER_REASON = "a hidden folder, not read"


def is_supported(path: str | PurePath) -> bool:
    """Whether ingest reads a file of this name (by its suffix, in any case)."""
    return PurePath(path).suffix.lower() in SUPPORTED_SUFFIXES


def is_hidden(name: str) -> bool:
    """Whether a file or folder name is hidden (starts with ``.``), as ingest leaves it out."""
    return name.startswith(".")


def supported_types() -> str:
    """The suffixes ingest reads, for a message: ``".csv, .docx, ..., .xhtml"``."""
    return ", ".join(sorted(SUPPORTED_SUFFIXES))


def unsupported_type_reason(path: str | PurePath) -> str:
    """Why a file is not read: ``"unsupported type .xyz"`` (or ``"... (no suffix)"``)."""
    return f"unsupported type {PurePath(path).suffix.lower() or '(no suffix)'}"


def unsupported_type_message(name: str | PurePath) -> str:
    """The error for a file of a type ingest does not read, naming the types it does."""
    return f"{name}: {unsupported_type_reason(name)}; ingest reads {supported_types()}"
