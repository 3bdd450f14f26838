"""Where the Runnable and the retriever get candidate chunks, as nested retriever runs."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.retrievers import BaseRetriever

from adarag import AdaRAG, Chunk, ConfigError, Retriever
from adarag.retrievers import LangChainRetriever
from langchain_adarag._convert import document_from_chunk

RETRIEVER_RUN_NAME = "adarag_retriever"


def as_source(retriever: Any) -> Retriever | None:
    """A LangChain retriever wrapped for adarag; an adarag retriever (or None) as it is."""
    if isinstance(retriever, BaseRetriever):
        return LangChainRetriever(retriever)
    if retriever is not None and not isinstance(retriever, Retriever):
        raise ConfigError(
            f"retriever must be a LangChain BaseRetriever or an adarag Retriever, got "
            f"{type(retriever).__name__}"
        )
    return retriever


def _source(rag: AdaRAG, source: Retriever | None) -> Retriever:
    found = source or rag.retriever
    if found is None:
        raise ConfigError(
            "no retriever: pass retriever=... (a LangChain or adarag retriever) or build the "
            "AdaRAG with one"
        )
    return found


def retrieve(
    rag: AdaRAG, source: Retriever | None, question: str, k: int, callbacks: CallbackManager
) -> list[Chunk]:
    """Candidate chunks, reported as a child retriever run."""
    found = _source(rag, source)
    if isinstance(found, LangChainRetriever):  # runs as its own child retriever run
        return found.retrieve(question, k, config={"callbacks": callbacks})
    run = callbacks.on_retriever_start(None, question, name=RETRIEVER_RUN_NAME)
    try:
        chunks = found.retrieve(question, k)
    except BaseException as err:
        run.on_retriever_error(err)
        raise
    run.on_retriever_end([document_from_chunk(chunk) for chunk in chunks])
    return chunks


async def aretrieve(
    rag: AdaRAG, source: Retriever | None, question: str, k: int, callbacks: AsyncCallbackManager
) -> list[Chunk]:
    """Async :func:`retrieve`; an adarag retriever runs in a worker thread."""
    found = _source(rag, source)
    if isinstance(found, LangChainRetriever):
        return await found.aretrieve(question, k, config={"callbacks": callbacks})
    run = await callbacks.on_retriever_start(None, question, name=RETRIEVER_RUN_NAME)
    try:
        chunks = await asyncio.to_thread(found.retrieve, question, k)
    except BaseException as err:
        await run.on_retriever_error(err)
        raise
    await run.on_retriever_end([document_from_chunk(chunk) for chunk in chunks])
    return chunks
