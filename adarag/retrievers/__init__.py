"""Knowledge sources: the Retriever protocol and its implementations.

chromadb, sentence-transformers, LlamaIndex and LangChain are imported only when a class that
needs them is used.
"""

from __future__ import annotations

from adarag.retrievers.adapters import (
    LangChainRetriever,
    LlamaIndexRetriever,
    chunks_from_documents,
)
from adarag.retrievers.base import Retriever
from adarag.retrievers.chroma import ChromaRetriever
from adarag.retrievers.embedding import Embedder, SentenceEmbedder
from adarag.retrievers.knowledge_base import IngestReport, KnowledgeBase
from adarag.retrievers.memory import MemoryRetriever

__all__ = [
    "ChromaRetriever",
    "IngestReport",
    "KnowledgeBase",
    "LangChainRetriever",
    "LlamaIndexRetriever",
    "MemoryRetriever",
    "Retriever",
    "Embedder",
    "SentenceEmbedder",
    "chunks_from_documents",
]
