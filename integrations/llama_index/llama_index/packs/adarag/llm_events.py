"""The generation inside an adaptive answer, reported as LlamaIndex LLM chat events.

Instrumentation handlers see the model call of :class:`AdaptiveCachedQueryEngine` and
:class:`AdaptiveChatEngine` as they see any LLM's: ``LLMChatStartEvent`` with the messages the
model was given (the context opens the first user turn), ``LLMChatInProgressEvent`` per
streamed delta and ``LLMChatEndEvent`` with the answer and its token usage in ``raw``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import llama_index.core.instrumentation as instrument
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
)
from llama_index.packs.adarag.response import token_usage

from adarag import AdaRAG, Answer, AnswerStream, AsyncAnswerStream, GenerationParams

dispatcher = instrument.get_dispatcher(__name__)


class GenerationEvents:
    """The events of one answer's generation: start, each delta, end."""

    def __init__(
        self, rag: AdaRAG, stream: AnswerStream, question: str, history: list[tuple[str, str]]
    ) -> None:
        chunks = [chunk.text for chunk in stream.chunks]
        self.messages = [
            ChatMessage(role=message["role"], content=message["content"])
            for message in rag.prompts.messages(question, chunks, history)
        ]
        self.model = rag.config.engine.model
        self.text = ""

    def start(self, params: GenerationParams) -> None:
        """The model is called with :attr:`messages`."""
        dispatcher.event(
            LLMChatStartEvent(
                messages=self.messages,
                additional_kwargs=params.model_dump(),
                model_dict={"model_name": self.model, "class_name": "AdaRagLLM"},
            )
        )

    def delta(self, delta: str) -> None:
        """One streamed delta of the answer."""
        self.text += delta
        dispatcher.event(
            LLMChatInProgressEvent(messages=self.messages, response=self._response(delta=delta))
        )

    def end(self, answer: Answer) -> None:
        """The whole answer, with its usage."""
        self.text = answer.text
        response = self._response(raw={"usage": token_usage(answer)})
        dispatcher.event(LLMChatEndEvent(messages=self.messages, response=response))

    def relay(self, stream: AnswerStream) -> Iterator[str]:
        """``stream``'s deltas, each reported, then the end."""
        for delta in stream:
            self.delta(delta)
            yield delta
        self.end(stream.answer())

    async def arelay(self, stream: AsyncAnswerStream) -> AsyncIterator[str]:
        """Async :meth:`relay`."""
        async for delta in stream:
            self.delta(delta)
            yield delta
        self.end(await stream.answer())

    def _response(self, delta: str | None = None, raw: dict | None = None) -> ChatResponse:
        message = ChatMessage(role=MessageRole.ASSISTANT, content=self.text)
        return ChatResponse(message=message, delta=delta, raw=raw)
