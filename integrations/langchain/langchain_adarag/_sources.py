"""Where the Runnable and the retriever get candidate chunks, as nested retriever runs."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable

from adarag import AdaRAG, Chunk, ConfigError, Retriever
from adarag.retrievers import LangChainRetriever, chunks_from_documents
from langchain_adarag._convert import document_from_chunk

RETRIEVER_RUN_NAME = "adarag_retriever"


class ConversationRetriever:
    """A Runnable from ``{"input": question, "chat_history": messages}`` to Documents.

    What ``create_history_aware_retriever`` builds (a prompt and a model condensing the
    conversation into a search query, then a retriever). It is given the conversation itself;
    other retrievers get the conversation's retrieval text (``AdaRAG.standalone_question``).
    """

    def __init__(self, runnable: Runnable) -> None:
        self.runnable = runnable

    def inputs(self, question: str, history: list[tuple[str, str]]) -> dict[str, Any]:
        """The Runnable's input for ``question`` after the turns of ``history``."""
        messages: list[BaseMessage] = []
        for asked, answered in history:
            messages += [HumanMessage(asked), AIMessage(answered)]
        return {"input": question, "chat_history": messages}


Source = Retriever | ConversationRetriever


def as_source(retriever: Any) -> Source | None:
    """A LangChain retriever or Runnable retriever wrapped; an adarag one (or None) as it is."""
    if isinstance(retriever, ConversationRetriever):
        return retriever
    if isinstance(retriever, BaseRetriever):
        return LangChainRetriever(retriever)
    if isinstance(retriever, Runnable):
        return ConversationRetriever(retriever)
    if retriever is not None and not isinstance(retriever, Retriever):
        raise ConfigError(
            f"retriever must be a LangChain BaseRetriever, a Runnable returning Documents or an "
            f"adarag Retriever, got {type(retriever).__name__}"
        )
    return retriever


def _source(rag: AdaRAG, source: Source | None) -> Source:
    found = source or rag.retriever
    if found is None:
        raise ConfigError(
            "no retriever: pass retriever=... (a LangChain or adarag retriever) or build the "
            "AdaRAG with one"
        )
    return found


def retrieve(
    rag: AdaRAG,
    source: Source | None,
    question: str,
    history: list[tuple[str, str]],
    k: int,
    callbacks: CallbackManager,
) -> list[Chunk]:
    """Candidate chunks for ``question`` after ``history``, reported as a child run."""
    found = _source(rag, source)
    config = {"callbacks": callbacks}
    if isinstance(found, ConversationRetriever):  # runs as its own child run
        documents = found.runnable.invoke(found.inputs(question, history), config=config)
        return chunks_from_documents(list(documents))[:k]
    query = rag.standalone_question(question, history)
    if isinstance(found, LangChainRetriever):  # runs as its own child retriever run
        return found.retrieve(query, k, config=config)
    run = callbacks.on_retriever_start(None, query, name=RETRIEVER_RUN_NAME)
    try:
        chunks = found.retrieve(query, k)
    except BaseException as err:
        run.on_retriever_error(err)
        raise
    run.on_retriever_end([document_from_chunk(chunk) for chunk in chunks])
    return chunks


async def aretrieve(
    rag: AdaRAG,
    source: Source | None,
    question: str,
    history: list[tuple[str, str]],
    k: int,
    callbacks: AsyncCallbackManager,
) -> list[Chunk]:
    """Async :func:`retrieve`; an adarag retriever runs in a worker thread."""
    found = _source(rag, source)
    config = {"callbacks": callbacks}
    if isinstance(found, ConversationRetriever):
        documents = await found.runnable.ainvoke(found.inputs(question, history), config=config)
        return chunks_from_documents(list(documents))[:k]
    query = await asyncio.to_thread(rag.standalone_question, question, history)
    if isinstance(found, LangChainRetriever):
        return await found.aretrieve(query, k, config=config)
    run = await callbacks.on_retriever_start(None, query, name=RETRIEVER_RUN_NAME)
    try:
        chunks = await asyncio.to_thread(found.retrieve, query, k)
    except BaseException as err:
        await run.on_retriever_error(err)
        raise
    await run.on_retriever_end([document_from_chunk(chunk) for chunk in chunks])
    return chunks
