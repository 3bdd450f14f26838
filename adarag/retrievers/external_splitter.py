"""A LlamaIndex node parser, a LangChain text splitter or a function, as ingest's splitter.

The splitter cuts each section of a document: a file with headings (markdown, or HTML and Word
converted) is first cut at them, as the built-in ``markdown`` splitter does, so every chunk
still records its heading path and an edited section changes only its own chunks. Chunk ids
stay hashes of their text, so a chunk the splitter cuts the same way on a re-ingest keeps its
id and its KV. Neither framework is imported here unless a LlamaIndex node parser without
``split_text`` needs its ``Document`` type.
"""

from __future__ import annotations

import inspect
from typing import Any

from adarag.errors import ConfigError
from adarag.retrievers.splitting import Section, markdown_sections


class ExternalSplitter:
    """Cuts text with a framework's splitter; :attr:`name` is recorded with every chunk.

    Args:
        splitter: One of

            - an object with ``split_text(text)`` (LangChain's ``TextSplitter`` and its
              subclasses; LlamaIndex's ``SentenceSplitter``, ``TokenTextSplitter`` and every
              other LlamaIndex ``TextSplitter``);
            - a LlamaIndex ``NodeParser`` (``get_nodes_from_documents``), e.g.
              ``SemanticSplitterNodeParser``;
            - a function from a text to its pieces.

    Raises:
        ConfigError: ``splitter`` is none of these.
    """

    def __init__(self, splitter: Any) -> None:
        if not (
            callable(getattr(splitter, "split_text", None))
            or callable(getattr(splitter, "get_nodes_from_documents", None))
            or callable(splitter)
        ):
            raise ConfigError(
                f"a splitter must be a LlamaIndex NodeParser, a LangChain TextSplitter or a "
                f"function from a text to a list of texts; got {type(splitter).__name__}"
            )
        self.splitter = splitter
        self.name = _describe(splitter)

    def split(self, text: str) -> list[str]:
        """The non-empty pieces the splitter cuts ``text`` into, stripped."""
        split_text = getattr(self.splitter, "split_text", None)
        if callable(split_text):
            pieces = split_text(text)
        elif callable(getattr(self.splitter, "get_nodes_from_documents", None)):
            from llama_index.core.schema import Document

            pieces = self.splitter.get_nodes_from_documents([Document(text=text)])
        else:
            pieces = self.splitter(text)
        texts = [_piece_text(piece, self.name) for piece in pieces]
        return [piece.strip() for piece in texts if piece.strip()]

    def split_document(self, text: str, *, has_headings: bool) -> list[tuple[str | None, str]]:
        """A document's chunks as ``(heading path or None, text)``, section by section."""
        sections = markdown_sections(text) if has_headings else [Section(None, text)]
        return [
            (section.heading, piece) for section in sections for piece in self.split(section.text)
        ]


def _piece_text(piece: Any, name: str) -> str:
    """A piece's text: a string, a LangChain ``Document`` or a LlamaIndex node."""
    if isinstance(piece, str):
        return piece
    page_content = getattr(piece, "page_content", None)
    if isinstance(page_content, str):
        return page_content
    get_content = getattr(piece, "get_content", None)
    if callable(get_content):
        return str(get_content())
    raise ConfigError(
        f"the splitter {name} returned a {type(piece).__name__}; it must return texts, "
        "LangChain Documents or LlamaIndex nodes"
    )


def _describe(splitter: Any) -> str:
    """The splitter's class (or function) with its chunk size and overlap, when it has them."""
    owner = splitter if inspect.isroutine(splitter) else type(splitter)
    name = f"{owner.__module__}.{owner.__qualname__}"
    settings = []
    for setting in ("chunk_size", "chunk_overlap"):
        value = getattr(splitter, setting, getattr(splitter, f"_{setting}", None))
        if isinstance(value, int):
            settings.append(f"{setting}={value}")
    return f"{name}({', '.join(settings)})" if settings else name
