"""The request path: the pipeline class, its augmentation steps, prompts and answer streams."""

from __future__ import annotations

from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER, AnswerStream, AsyncAnswerStream
from adarag.pipeline.prompt import CITATION_KEY, cited_numbers, retrieval_query
from adarag.pipeline.rag import AdaRAG
from adarag.pipeline.request import Request
from adarag.pipeline.views import CacheReport

__all__ = [
    "CITATION_KEY",
    "NO_CONTEXT_ANSWER",
    "AdaRAG",
    "AnswerStream",
    "AsyncAnswerStream",
    "CacheReport",
    "Request",
    "cited_numbers",
    "retrieval_query",
]
