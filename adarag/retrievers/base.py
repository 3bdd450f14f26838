"""The retriever protocol every knowledge source implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from adarag.schema import Chunk


@runtime_checkable
class Retriever(Protocol):
    """Returns the chunks most relevant to a query, best first."""

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` best chunks for ``query`` (fewer when the source has fewer)."""
        ...
