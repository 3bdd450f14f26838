"""The generation inside an adaptive answer, relayed through :class:`AdaRagLLM`'s chat methods.

:class:`AdaptiveCachedQueryEngine` and :class:`AdaptiveChatEngine` retrieve and prefill
themselves, then hand the prepared answer to a :class:`PreparedAnswerLLM`, whose chat methods
are AdaRagLLM's. LlamaIndex's own LLM instrumentation therefore reports the model call as any
LLM's, in the span of the caller (``synthesize``, ``stream_chat``): ``LLMChatStartEvent`` with
the messages the model was given (the context opens the first user turn),
``LLMChatInProgressEvent`` per streamed delta, ``LLMChatEndEvent`` with the answer and its token
usage in ``raw``, and the legacy ``CBEventType.LLM`` callback that ``TokenCountingHandler``
counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.packs.adarag.llm import AdaRagLLM

from adarag import AdaRAG, AnswerStream, AsyncAnswerStream, GenerationParams


class PreparedAnswerLLM(AdaRagLLM):
    """AdaRagLLM whose chat calls decode one answer already retrieved for and prefilled.

    One instance per answer; the messages given to its chat methods are reported, not
    generated from (they are the prompt the answer was prefilled with).

    Args:
        rag: The pipeline that prepared ``stream``.
        stream: The prepared answer.
        params: The decoding options it was prepared with (reported with the call).
        callback_manager: Legacy callbacks that see the LLM call (the engine's).
    """

    _prepared: AnswerStream = PrivateAttr()

    def __init__(
        self,
        rag: AdaRAG,
        stream: AnswerStream,
        params: GenerationParams,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        super().__init__(
            rag=rag,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            callback_manager=callback_manager or CallbackManager(),
        )
        self._prepared = stream

    @classmethod
    def class_name(cls) -> str:
        """Reported as the LLM it is."""
        return "AdaRagLLM"

    def _chat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> AnswerStream:
        return self._prepared

    async def _achat_stream(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> AsyncAnswerStream:
        return AsyncAnswerStream(self._prepared)


def prompt_messages(
    rag: AdaRAG, stream: AnswerStream, question: str, history: list[tuple[str, str]]
) -> list[ChatMessage]:
    """The turns the model was given: system prompt, context and earlier turns, the question."""
    chunks = [chunk.text for chunk in stream.chunks]
    return [
        ChatMessage(role=message["role"], content=message["content"])
        for message in rag.prompts.messages(question, chunks, history)
    ]
