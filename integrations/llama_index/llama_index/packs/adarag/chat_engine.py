"""AdaptiveChatEngine: a LlamaIndex chat engine over AdaptiveCachedQueryEngine.

Each message is answered like a query, with the recent grounded turns carried as chat turns
after the context (``AdaRAG.stream(history=...)``) and their user messages added to the
retrieval query, so a follow-up ("When did she die?") finds and answers about what the
conversation is about. The context chunks' KV stays reusable across turns. A turn answered
without context is not carried into later prompts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from threading import Thread
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.chat_engine.types import (
    AgentChatResponse,
    BaseChatEngine,
    StreamingAgentChatResponse,
)
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.packs.adarag.llm_events import GenerationEvents
from llama_index.packs.adarag.response import chunks_from_nodes, describe

from adarag import AnswerStream

if TYPE_CHECKING:
    from llama_index.packs.adarag.query_engine import AdaptiveCachedQueryEngine

GROUNDED = "adarag_grounded"  # an assistant message's additional_kwargs flag


class AdaptiveChatEngine(BaseChatEngine):
    """Multi-turn chat over an :class:`AdaptiveCachedQueryEngine` (``engine.as_chat_engine()``).

    Args:
        query_engine: Retrieval, pipeline and decoding options.
        max_turns: Earlier turns carried into the prompt and the retrieval query.
    """

    def __init__(self, query_engine: AdaptiveCachedQueryEngine, max_turns: int = 2) -> None:
        self._engine = query_engine
        self._max_turns = max_turns
        self._messages: list[ChatMessage] = []

    @property
    def chat_history(self) -> list[ChatMessage]:
        """Every message so far, oldest first."""
        return list(self._messages)

    def reset(self) -> None:
        """Forget the conversation."""
        self._messages = []

    def chat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> AgentChatResponse:
        """Answer ``message`` (``chat_history`` replaces the conversation so far when given)."""
        stream, used, events = self._start(message, chat_history)
        answer = stream.answer()
        events.end(answer)
        self._remember(message, answer.text, grounded=bool(answer.chunks))
        return AgentChatResponse(response=answer.text, source_nodes=used)

    def stream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> StreamingAgentChatResponse:
        """Stream the answer to ``message``; the turn is remembered when the stream ends."""
        stream, used, events = self._start(message, chat_history)
        response = StreamingAgentChatResponse(
            chat_stream=self._chat_stream(message, stream, events), source_nodes=used
        )
        thread = Thread(target=response.write_response_to_history, args=(_Discard(),))
        response.write_response_to_history_thread = thread
        thread.start()
        return response

    async def achat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> AgentChatResponse:
        """Async :meth:`chat` (the engine work runs in a worker thread)."""
        return await asyncio.to_thread(self.chat, message, chat_history)

    async def astream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> StreamingAgentChatResponse:
        """Async :meth:`stream_chat`: retrieval and prefill run in a worker thread."""
        return await asyncio.to_thread(self.stream_chat, message, chat_history)

    # --- internals

    def _turns(self) -> list[tuple[str, str]]:
        """The recent grounded (question, answer) pairs, oldest first."""
        turns = [
            (str(asked.content), str(answered.content))
            for asked, answered in zip(self._messages, self._messages[1:], strict=False)
            if asked.role == MessageRole.USER
            and answered.role == MessageRole.ASSISTANT
            and answered.additional_kwargs.get(GROUNDED, True)
        ]
        return turns[-self._max_turns :] if self._max_turns else []

    def _start(
        self, message: str, chat_history: list[ChatMessage] | None
    ) -> tuple[AnswerStream, list[NodeWithScore], GenerationEvents]:
        if chat_history is not None:
            self._messages = list(chat_history)
        turns = self._turns()
        query = self._engine.rag.standalone_question(message, turns)
        nodes = self._engine.retrieve(QueryBundle(query))
        stream = self._engine.rag.stream(
            message, chunks=chunks_from_nodes(nodes), params=self._engine.params, history=turns
        )
        used, _ = describe(stream, nodes)
        events = GenerationEvents(self._engine.rag, stream, message, turns)
        events.start(self._engine.params)
        return stream, used, events

    def _chat_stream(
        self, message: str, stream: AnswerStream, events: GenerationEvents
    ) -> Generator[ChatResponse, None, None]:
        text = ""
        for delta in events.relay(stream):
            text += delta
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta
            )
        answer = stream.answer()
        self._remember(message, answer.text, grounded=bool(answer.chunks))

    def _remember(self, message: str, answer: str, *, grounded: bool) -> None:
        self._messages.append(ChatMessage(role=MessageRole.USER, content=message))
        self._messages.append(
            ChatMessage(
                role=MessageRole.ASSISTANT, content=answer, additional_kwargs={GROUNDED: grounded}
            )
        )


class _Discard:
    """The memory LlamaIndex's streaming response writes to; the engine keeps its own."""

    def put(self, message: Any) -> None:
        """Ignore ``message`` (the engine records the turn when the stream ends)."""
