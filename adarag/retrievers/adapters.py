"""Any LlamaIndex or LangChain retriever as an adarag :class:`~adarag.retrievers.Retriever`.

The frameworks are imported only when an adapter is built, to check what it is given.
"""

from __future__ import annotations

from typing import Any

from adarag.errors import ConfigError, InputError, MissingDependencyError
from adarag.schema import Chunk

_SCORE_KEYS = ("score", "relevance_score", "similarity")


class LlamaIndexRetriever:
    """Chunks from a LlamaIndex ``BaseRetriever`` (its nodes' text, ids, scores and metadata).

    Example:
        >>> retriever = LlamaIndexRetriever(index.as_retriever(similarity_top_k=4))
        >>> rag = AdaRAG(retriever=retriever)

    Args:
        retriever: A ``llama_index.core`` ``BaseRetriever``; its own top-k bounds the results.

    Raises:
        MissingDependencyError: llama-index-core is not installed.
        ConfigError: ``retriever`` is not a LlamaIndex retriever.
    """

    def __init__(self, retriever: Any) -> None:
        try:
            from llama_index.core.base.base_retriever import BaseRetriever
        except ImportError as err:
            raise MissingDependencyError("llama-index-core", "llama-index") from err
        if not isinstance(retriever, BaseRetriever):
            raise ConfigError(
                f"expected a LlamaIndex BaseRetriever, got {type(retriever).__name__}; pass e.g. "
                "index.as_retriever()"
            )
        self.retriever = retriever

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        """The retriever's nodes for ``query`` as chunks, at most ``top_k``."""
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        nodes = self.retriever.retrieve(query)[:top_k]
        return [
            Chunk(node.get_content(), node.node_id, node.score, dict(node.node.metadata))
            for node in nodes
            if node.get_content().strip()
        ]


class LangChainRetriever:
    """Chunks from a LangChain ``BaseRetriever`` (its documents' text, ids and metadata).

    A document's score is read from its metadata (``score``, ``relevance_score`` or
    ``similarity``) when present.

    Example:
        >>> retriever = LangChainRetriever(vectorstore.as_retriever(search_kwargs={"k": 4}))
        >>> rag = AdaRAG(retriever=retriever)

    Args:
        retriever: A ``langchain_core`` ``BaseRetriever``; its own k bounds the results.

    Raises:
        MissingDependencyError: langchain-core is not installed.
        ConfigError: ``retriever`` is not a LangChain retriever.
    """

    def __init__(self, retriever: Any) -> None:
        try:
            from langchain_core.retrievers import BaseRetriever
        except ImportError as err:
            raise MissingDependencyError("langchain-core", "langchain") from err
        if not isinstance(retriever, BaseRetriever):
            raise ConfigError(
                f"expected a LangChain BaseRetriever, got {type(retriever).__name__}; pass e.g. "
                "vectorstore.as_retriever()"
            )
        self.retriever = retriever

    def retrieve(self, query: str, top_k: int, config: Any = None) -> list[Chunk]:
        """The retriever's documents for ``query`` as chunks, at most ``top_k``.

        Args:
            query: The search text.
            top_k: Most chunks returned.
            config: A LangChain ``RunnableConfig`` for the retriever run (callbacks, tags).
        """
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        return chunks_from_documents(self.retriever.invoke(query, config=config)[:top_k])

    async def aretrieve(self, query: str, top_k: int, config: Any = None) -> list[Chunk]:
        """Async :meth:`retrieve`, through the retriever's ``ainvoke``."""
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        documents = await self.retriever.ainvoke(query, config=config)
        return chunks_from_documents(documents[:top_k])


def chunks_from_documents(documents: list[Any]) -> list[Chunk]:
    """LangChain Documents as chunks (text, id, metadata, the score read from the metadata).

    Empty documents are left out.
    """
    chunks = []
    for document in documents:
        if not document.page_content.strip():
            continue
        metadata = dict(document.metadata)
        score = next((metadata[k] for k in _SCORE_KEYS if k in metadata), None)
        score = float(score) if isinstance(score, int | float) else None
        chunks.append(Chunk(document.page_content, document.id, score, metadata))
    return chunks
