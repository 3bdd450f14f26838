"""An adarag retriever (a Chroma knowledge base, BM25, ...) as a LlamaIndex retriever."""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from adarag import Chunk, Retriever


class AdaRagRetriever(BaseRetriever):
    """Nodes from any adarag ``Retriever``, e.g. ``KnowledgeBase`` or ``ChromaRetriever``.

    Node ids are the chunks' ids, scores their similarities. Chunk metadata stays on the node
    but out of the text the model sees, so a chunk's prompt text (and its cached KV) never
    changes from one query to the next.

    Args:
        retriever: The adarag retriever.
        similarity_top_k: Nodes per query.
        callback_manager: LlamaIndex callbacks.
    """

    def __init__(
        self,
        retriever: Retriever,
        similarity_top_k: int = 4,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        self._adarag_retriever = retriever
        self.similarity_top_k = similarity_top_k
        super().__init__(callback_manager=callback_manager)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        chunks = self._adarag_retriever.retrieve(query_bundle.query_str, self.similarity_top_k)
        return [node_from_chunk(chunk, idx) for idx, chunk in enumerate(chunks)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def node_from_chunk(chunk: Chunk, idx: int) -> NodeWithScore:
    """A scored text node holding ``chunk`` (its metadata hidden from the model's text)."""
    metadata: dict[str, Any] = dict(chunk.metadata)
    node = TextNode(
        text=chunk.text,
        id_=chunk.chunk_id or f"chunk-{idx}",
        metadata=metadata,
        excluded_llm_metadata_keys=list(metadata),
        excluded_embed_metadata_keys=list(metadata),
    )
    return NodeWithScore(node=node, score=chunk.score)
