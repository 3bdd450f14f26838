"""adarag for LangChain: the RAG Runnable, its retriever, and the generator as a chat model."""

from __future__ import annotations

from langchain_adarag.chat_models import ChatAdaRag
from langchain_adarag.retrievers import AdaptiveCachedRetriever
from langchain_adarag.runnables import AdaptiveCachedRAG

__all__ = ["AdaptiveCachedRAG", "AdaptiveCachedRetriever", "ChatAdaRag"]
