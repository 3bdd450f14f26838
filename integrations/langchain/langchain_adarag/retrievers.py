"""AdaptiveCachedRetriever: the chunks adarag's adaptive augmentation keeps for a question."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr

from adarag import AdaRAG, GenerationParams
from langchain_adarag import _sources
from langchain_adarag._convert import document_from_chunk

_PREFILL_ONLY = GenerationParams(max_new_tokens=1)


class AdaptiveCachedRetriever(BaseRetriever):
    """Retrieve top-k, run adarag's (cached) prefill, return the chunks it conditions on.

    With adaptive augmentation that is the prefix of the top-k the model was confident with;
    without it, the top-k. The prefill also warms the chunks' KV for a later answer. Each
    Document carries the chunk's ``score`` in its metadata.

    Instantiate:
        >>> from langchain_adarag import AdaptiveCachedRetriever
        >>> retriever = AdaptiveCachedRetriever(rag=rag, k=4)  # rag = AdaRAG(retriever=kb)
        >>> retriever = AdaptiveCachedRAG(rag=rag).as_retriever()

    Use with LangChain:
        >>> retriever.invoke("Who directed Aas Ka Panchhi?")
        >>> {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm
    """

    k: int | None = Field(default=None, ge=1)
    """Candidate chunks per question; None uses ``retrieval.top_k``."""
    _rag: AdaRAG = PrivateAttr()
    _source: _sources.Source | None = PrivateAttr(default=None)

    def __init__(self, *, rag: AdaRAG, retriever: Any = None, **kwargs: Any) -> None:
        """Build the retriever.

        Args:
            rag: The adarag pipeline.
            retriever: A LangChain or adarag retriever; the pipeline's own when None.
            **kwargs: Fields (``k``, ``tags``, ``metadata``).
        """
        super().__init__(**kwargs)
        self._rag = rag
        self._source = _sources.as_source(retriever)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        top_k = k or self.k or self._rag.config.retrieval.top_k
        callbacks = run_manager.get_child()
        chunks = _sources.retrieve(self._rag, self._source, query, [], top_k, callbacks)
        if not chunks:
            return []
        stream = self._rag.stream(query, chunks=chunks, params=_PREFILL_ONLY)
        return [document_from_chunk(chunk) for chunk in stream.chunks]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        top_k = k or self.k or self._rag.config.retrieval.top_k
        callbacks = run_manager.get_child()
        chunks = await _sources.aretrieve(self._rag, self._source, query, [], top_k, callbacks)
        if not chunks:
            return []
        stream = await self._rag.astream(query, chunks=chunks, params=_PREFILL_ONLY)
        return [document_from_chunk(chunk) for chunk in stream.chunks]
