"""adarag's offline sentence embedder as a LlamaIndex embedding model."""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

from adarag.config import DEFAULT_MODEL
from adarag.retrievers import SentenceEmbedder


class AdaRagEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 (or any local sentence-transformers directory), never downloaded.

    The same vectors as adarag's knowledge base, so a ``VectorStoreIndex`` over a collection that
    ``adarag ingest`` wrote queries it correctly.

    Example:
        >>> from llama_index.core import VectorStoreIndex
        >>> index = VectorStoreIndex.from_vector_store(store, embed_model=AdaRagEmbedding())

    Args:
        model: ``"default"`` or a local sentence-transformers directory (its ``model_name``).
    """

    _embedder: SentenceEmbedder = PrivateAttr()

    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        super().__init__(model_name=model, **kwargs)
        self._embedder = SentenceEmbedder(model)

    @classmethod
    def class_name(cls) -> str:
        """Name of the component."""
        return "AdaRagEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embedder.embed_query(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embedder.embed_documents([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embedder.embed_documents(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._embedder.embed_query, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await asyncio.to_thread(self._embedder.embed_documents, [text]))[0]
