"""adarag for LlamaIndex: AdaptiveCachedQueryEngine and the engine as an LLM."""

from __future__ import annotations

from llama_index.packs.adarag.chat_engine import AdaptiveChatEngine
from llama_index.packs.adarag.embedding import AdaRagEmbedding
from llama_index.packs.adarag.events import AdaptiveStepEvent, AdaptiveStopEvent
from llama_index.packs.adarag.llm import AdaRagLLM
from llama_index.packs.adarag.query_engine import AdaptiveCachedQueryEngine
from llama_index.packs.adarag.retriever import AdaRagRetriever

__all__ = [
    "AdaRagEmbedding",
    "AdaRagLLM",
    "AdaRagRetriever",
    "AdaptiveCachedQueryEngine",
    "AdaptiveChatEngine",
    "AdaptiveStepEvent",
    "AdaptiveStopEvent",
]
