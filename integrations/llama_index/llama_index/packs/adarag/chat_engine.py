"""AdaptiveChatEngine: a LlamaIndex chat engine over AdaptiveCachedQueryEngine.

Each message is answered like a query, with the recent grounded turns carried as chat turns
after the context (``AdaRAG.stream(history=...)``) and their messages and answers added to the
retrieval query (``chat.standalone_question``), so a follow-up ("When did she die?") finds and
answers about what the conversation is about. The model call is AdaRagLLM's, so LlamaIndex's LLM
events report it inside the chat call's span, and ``astream_chat`` streams deltas to
``async_response_gen`` as they are decoded. The context chunks' KV stays reusable across turns.
A turn answered without context is not carried into later prompts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from threading import Thread
from typing import TYPE_CHECKING, Any, Protocol

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.types import (
    AgentChatResponse,
    BaseChatEngine,
    StreamingAgentChatResponse,
)
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.packs.adarag.llm_events import PreparedAnswerLLM, prompt_messages
from llama_index.packs.adarag.response import chunks_from_nodes, describe

from adarag import AdaRAG, Answer, AnswerStream, GenerationParams

if TYPE_CHECKING:
    from llama_index.core.callbacks import CallbackManager

GROUNDED = "adarag_grounded"  # an assistant message's additional_kwargs flag


class AnsweringEngine(Protocol):
    """What a chat engine answers through; :class:`AdaptiveCachedQueryEngine` is one.

    The chat engine needs only these members, so it never imports the query engine module (which
    imports this one for ``as_chat_engine``).
    """

    @property
    def rag(self) -> AdaRAG:
        """The adarag pipeline answering."""
        ...

    @property
    def params(self) -> GenerationParams:
        """Decoding options of every answer."""
        ...

    @property
    def callback_manager(self) -> CallbackManager:
        """LlamaIndex's legacy callbacks the answers report to."""
        ...

    def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """The nodes to answer ``query_bundle`` from."""
        ...


class AdaptiveChatEngine(BaseChatEngine):
    """Multi-turn chat over an :class:`AdaptiveCachedQueryEngine` (``engine.as_chat_engine()``).

    Args:
        query_engine: Retrieval, pipeline and decoding options (an
            :class:`AdaptiveCachedQueryEngine`, or any :class:`AnsweringEngine`).
        max_turns: Earlier turns carried into the prompt and the retrieval query.
    """

    def __init__(self, query_engine: AnsweringEngine, max_turns: int = 2) -> None:
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
        turn = self._start(message, chat_history)
        reply = turn.llm.chat(turn.messages)
        self._remember(message, turn.stream.answer())
        return AgentChatResponse(response=str(reply.message.content or ""), source_nodes=turn.used)

    def stream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> StreamingAgentChatResponse:
        """Stream the answer to ``message``; the turn is remembered when the stream ends."""
        turn = self._start(message, chat_history)
        response = StreamingAgentChatResponse(
            chat_stream=turn.llm.stream_chat(turn.messages), source_nodes=turn.used
        )
        remember = partial(self._remember_streamed, message, turn.stream)
        thread = Thread(
            target=response.write_response_to_history,
            args=(_Discard(),),
            kwargs={"on_stream_end_fn": remember},
        )
        response.write_response_to_history_thread = thread
        thread.start()
        return response

    async def achat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> AgentChatResponse:
        """Async :meth:`chat`: retrieval, prefill and each decoding step run in worker threads."""
        turn = await asyncio.to_thread(self._start, message, chat_history)
        reply = await turn.llm.achat(turn.messages)
        self._remember(message, turn.stream.answer())
        return AgentChatResponse(response=str(reply.message.content or ""), source_nodes=turn.used)

    async def astream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None
    ) -> StreamingAgentChatResponse:
        """Async :meth:`stream_chat`: deltas reach ``async_response_gen`` as they are decoded.

        Retrieval, prefill and each decoding step run in worker threads.
        """
        turn = await asyncio.to_thread(self._start, message, chat_history)
        response = StreamingAgentChatResponse(
            achat_stream=await turn.llm.astream_chat(turn.messages), source_nodes=turn.used
        )
        remember = partial(self._remember_streamed, message, turn.stream)
        response.awrite_response_to_history_task = asyncio.create_task(
            response.awrite_response_to_history(_Discard(), on_stream_end_fn=remember)
        )
        return response

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

    def _start(self, message: str, chat_history: list[ChatMessage] | None) -> _Turn:
        """Retrieve and prefill the answer to ``message``."""
        if chat_history is not None:
            self._messages = list(chat_history)
        turns = self._turns()
        rag = self._engine.rag
        nodes = self._engine.retrieve(QueryBundle(rag.standalone_question(message, turns)))
        params = self._engine.params
        stream = rag.stream(message, chunks=chunks_from_nodes(nodes), params=params, history=turns)
        used, _ = describe(stream, nodes)
        llm = PreparedAnswerLLM(rag, stream, params, self._engine.callback_manager)
        return _Turn(stream, used, llm, prompt_messages(rag, stream, message, turns))

    def _remember_streamed(self, message: str, stream: AnswerStream) -> None:
        """Record a streamed turn once its stream has ended."""
        self._remember(message, stream.answer())

    def _remember(self, message: str, answer: Answer) -> None:
        self._messages.append(ChatMessage(role=MessageRole.USER, content=message))
        self._messages.append(
            ChatMessage(
                role=MessageRole.ASSISTANT,
                content=answer.text,
                additional_kwargs={GROUNDED: bool(answer.chunks)},
            )
        )


@dataclass(frozen=True)
class _Turn:
    """A message's answer, prepared: its stream, the nodes used, the LLM relaying it."""

    stream: AnswerStream
    used: list[NodeWithScore]
    llm: PreparedAnswerLLM
    messages: list[ChatMessage]


class _Discard:
    """The memory LlamaIndex's streaming response writes to; the engine keeps its own."""

    def put(self, message: Any) -> None:
        """Ignore ``message`` (the engine records the turn when the stream ends)."""

    async def aput(self, message: Any) -> None:
        """Async :meth:`put`."""
