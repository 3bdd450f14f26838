"""The generation inside a RAG answer, reported to LangChain as a chat-model run.

Tracers, ``astream_events`` (``on_chat_model_start`` / ``_stream`` / ``_end``) and usage
handlers (``UsageMetadataCallbackHandler``) see the model call of :class:`AdaptiveCachedRAG`
as they see any chat model's: a child run of the chain, with the messages the model was given,
each streamed token, and the final message with its usage.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_messages,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult

from adarag import AdaRAG, Answer, Chunk, GenerationParams
from langchain_adarag._convert import usage_metadata

RUN_NAME = "ChatAdaRag"


def run_messages(
    rag: AdaRAG, question: str, history: list[tuple[str, str]], chunks: list[Chunk]
) -> list[BaseMessage]:
    """The turns the model is given (``PromptBuilder.messages``).

    The system prompt, the context opening the first user turn, earlier turns, the question.
    """
    return convert_to_messages(rag.prompts.messages(question, [c.text for c in chunks], history))


def _start_kwargs(rag: AdaRAG, params: GenerationParams) -> dict[str, Any]:
    invocation = {"model_name": rag.model_name, "_type": "adarag"}
    invocation |= {"max_tokens": params.max_new_tokens, "temperature": params.temperature}
    return {"name": RUN_NAME, "invocation_params": invocation}


def _final(rag: AdaRAG, answer: Answer) -> LLMResult:
    message = AIMessage(
        content=answer.text,
        usage_metadata=usage_metadata(answer),
        response_metadata={"model_name": rag.model_name, "ttft_s": answer.trace.ttft_s},
    )
    return LLMResult(generations=[[ChatGeneration(message=message)]])


def _chunk(delta: str) -> ChatGenerationChunk:
    return ChatGenerationChunk(message=AIMessageChunk(content=delta))


class ChatRun:
    """A started chat-model run: report tokens, then the answer or the error."""

    def __init__(self, rag: AdaRAG, run: CallbackManagerForLLMRun) -> None:
        self.rag, self.run = rag, run

    @classmethod
    def start(
        cls,
        callbacks: CallbackManager,
        rag: AdaRAG,
        messages: list[BaseMessage],
        params: GenerationParams,
    ) -> ChatRun:
        """Open the run as a child of ``callbacks``' owner."""
        kwargs = _start_kwargs(rag, params)
        (run,) = callbacks.on_chat_model_start({"name": RUN_NAME}, [messages], **kwargs)
        return cls(rag, run)

    def token(self, delta: str) -> None:
        """One streamed answer delta."""
        self.run.on_llm_new_token(delta, chunk=_chunk(delta))

    def end(self, answer: Answer) -> None:
        """The final message, with its usage."""
        self.run.on_llm_end(_final(self.rag, answer))

    def error(self, error: BaseException) -> None:
        """The run failed or was cancelled."""
        self.run.on_llm_error(error)


class AsyncChatRun:
    """:class:`ChatRun` for async callbacks."""

    def __init__(self, rag: AdaRAG, run: AsyncCallbackManagerForLLMRun) -> None:
        self.rag, self.run = rag, run

    @classmethod
    async def start(
        cls,
        callbacks: AsyncCallbackManager,
        rag: AdaRAG,
        messages: list[BaseMessage],
        params: GenerationParams,
    ) -> AsyncChatRun:
        """Open the run as a child of ``callbacks``' owner."""
        kwargs = _start_kwargs(rag, params)
        (run,) = await callbacks.on_chat_model_start({"name": RUN_NAME}, [messages], **kwargs)
        return cls(rag, run)

    async def token(self, delta: str) -> None:
        """One streamed answer delta."""
        await self.run.on_llm_new_token(delta, chunk=_chunk(delta))

    async def end(self, answer: Answer) -> None:
        """The final message, with its usage."""
        await self.run.on_llm_end(_final(self.rag, answer))

    async def error(self, error: BaseException) -> None:
        """The run failed or was cancelled."""
        await self.run.on_llm_error(error)
