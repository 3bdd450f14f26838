"""adarag: faster RAG through chunk-KV reuse with selective recomputation (AdaCache)."""

from __future__ import annotations

from adarag.config import AdaRagConfig
from adarag.errors import AdaRagError, ConfigError, InputError, ModelLoadError
from adarag.pipeline import AdaRAG, AnswerStream, AsyncAnswerStream
from adarag.retrievers import MemoryRetriever, Retriever
from adarag.schema import Answer, Chunk, GenerationParams, PromptLayout, QueryTrace, StepTrace

__all__ = [
    "AdaRAG",
    "AnswerStream",
    "AsyncAnswerStream",
    "MemoryRetriever",
    "Retriever",
    "AdaRagConfig",
    "AdaRagError",
    "Answer",
    "Chunk",
    "ConfigError",
    "GenerationParams",
    "InputError",
    "ModelLoadError",
    "PromptLayout",
    "QueryTrace",
    "StepTrace",
]
__version__ = "0.1.0"
