"""ChatAdaRag: adarag's local generator as a LangChain chat model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field, PrivateAttr

from adarag import AdaRAG, AdaRagConfig, Answer, GenerationParams
from langchain_adarag._convert import chat_messages, usage_metadata


class ChatAdaRag(BaseChatModel):
    """The adarag model (SmolLM2-135M-Instruct by default) as a chat model; nothing downloaded.

    Setup:
        ``pip install -e integrations/langchain`` (``make install`` does it).

    Instantiate:
        >>> from langchain_adarag import ChatAdaRag
        >>> model = ChatAdaRag(max_tokens=64)  # or ChatAdaRag(rag=rag) to share a model

    Invoke and stream:
        >>> model.invoke("Name a prime number.").content
        >>> for chunk in model.stream("Count to three."): print(chunk.content, end="")

    Async (each engine step runs in a worker thread):
        >>> await model.ainvoke("...")

    Usage is on the message (``usage_metadata``, on the last chunk when streaming). Tool
    calling and structured output are not supported.
    """

    adarag_config: AdaRagConfig = Field(default_factory=AdaRagConfig)
    """adarag settings of a pipeline built here (ignored when ``rag`` is given)."""
    max_tokens: int = Field(default=256, ge=1)
    """Answer length cap."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature; 0 is greedy."""
    streaming: bool = False
    """``invoke`` streams internally (callbacks see each token)."""
    _rag: AdaRAG = PrivateAttr()

    def __init__(self, *, rag: AdaRAG | None = None, **kwargs: Any) -> None:
        """Build the model.

        Args:
            rag: The adarag pipeline whose model answers; built from ``adarag_config`` if None.
            **kwargs: Fields.
        """
        if rag is not None:
            kwargs.setdefault("adarag_config", rag.config)
        super().__init__(**kwargs)
        self._rag = rag or AdaRAG(self.adarag_config)

    @property
    def rag(self) -> AdaRAG:
        """The adarag pipeline."""
        return self._rag

    @property
    def _llm_type(self) -> str:
        return "adarag"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.adarag_config.engine.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        params = self._params(stop, **kwargs)
        answer = self._rag.generate(chat_messages(messages), params=params).answer()
        return self._result(answer, params)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        params = self._params(stop, **kwargs)
        stream = await self._rag.agenerate(chat_messages(messages), params=params)
        return self._result(await stream.answer(), params)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        params = self._params(stop, **kwargs)
        stream = self._rag.generate(chat_messages(messages), params=params)
        for delta in stream:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager is not None:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield self._last_chunk(stream.answer(), params)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        params = self._params(stop, **kwargs)
        stream = await self._rag.agenerate(chat_messages(messages), params=params)
        async for delta in stream:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager is not None:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield self._last_chunk(await stream.answer(), params)

    # --- internals

    def _params(self, stop: list[str] | None, **kwargs: Any) -> GenerationParams:
        """Decoding options; ``max_tokens`` and ``temperature`` may be bound per call."""
        return GenerationParams(
            max_new_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            stop=tuple(stop or ()),
        )

    def _metadata(self, answer: Answer, params: GenerationParams) -> dict[str, Any]:
        hit_cap = answer.num_completion_tokens >= params.max_new_tokens
        return {
            "model_name": self.adarag_config.engine.model,
            "finish_reason": "length" if hit_cap else "stop",
            "ttft_s": answer.trace.ttft_s,
        }

    def _result(self, answer: Answer, params: GenerationParams) -> ChatResult:
        message = AIMessage(
            content=answer.text,
            usage_metadata=usage_metadata(answer),
            response_metadata=self._metadata(answer, params),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _last_chunk(self, answer: Answer, params: GenerationParams) -> ChatGenerationChunk:
        message = AIMessageChunk(
            content="",
            usage_metadata=usage_metadata(answer),
            response_metadata=self._metadata(answer, params),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message)
