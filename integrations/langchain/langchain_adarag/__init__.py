"""adarag for LangChain: the RAG Runnable, its retriever, a chat model and embeddings."""

from __future__ import annotations

from langchain_adarag.chat_models import ChatAdaRag
from langchain_adarag.embeddings import AdaRagEmbeddings
from langchain_adarag.retrievers import AdaptiveCachedRetriever
from langchain_adarag.runnables import AdaptiveCachedRAG

__all__ = ["AdaRagEmbeddings", "AdaptiveCachedRAG", "AdaptiveCachedRetriever", "ChatAdaRag"]
