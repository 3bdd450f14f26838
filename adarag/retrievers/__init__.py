"""Knowledge sources: the Retriever protocol and its implementations."""

from __future__ import annotations

from adarag.retrievers.base import Retriever
from adarag.retrievers.memory import MemoryRetriever

__all__ = ["MemoryRetriever", "Retriever"]
