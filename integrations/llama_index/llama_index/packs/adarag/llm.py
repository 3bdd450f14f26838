"""adarag's local engine as a LlamaIndex LLM: complete, chat and streaming, really async."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import default_completion_to_prompt
from llama_index.packs.adarag.response import token_usage

from adarag import (
    AdaRAG,
    AdaRagConfig,
    Answer,
    AnswerStream,
    AsyncAnswerStream,
    GenerationParams,
)

Prompt = str | list[dict[str, str]]


class AdaRagLLM(CustomLLM):
    """The adarag model as a LlamaIndex chat LLM (the model's own chat template, no download).

    Setup:
        ``pip install -e integrations/llama_index`` (``make install`` does it).

    Instantiate:
        >>> from llama_index.packs.adarag import AdaRagLLM
        >>> llm = AdaRagLLM(max_new_tokens=64)  # or AdaRagLLM(rag=rag) to share a model

    Complete and chat:
        >>> llm.complete("Name a prime number.").text
        >>> llm.chat([ChatMessage(role="user", content="Hello")]).message.content
        >>> for part in llm.stream_complete("Count to three."): print(part.delta, end="")

    Async (each engine step runs in a worker thread):
        >>> await llm.acomplete("...")

    Use with LlamaIndex:
        >>> Settings.llm = llm

    ``complete`` wraps the prompt in the chat template as a user turn, unless ``formatted=True``
    or a ``completion_to_prompt`` was given (then the text goes to the model as it is). Token
    usage is in ``response.raw["usage"]`` (``prompt_tokens``, ``completion_tokens``,
    ``cached_tokens``), where ``TokenCountingHandler`` reads it.

    Args:
        rag: The adarag pipeline whose model answers; built from ``config`` when None.
        config: Configuration of a pipeline built here.
        max_new_tokens: Answer length cap.
        temperature: Sampling temperature; 0 is greedy.
    """

    config: AdaRagConfig = Field(default_factory=AdaRagConfig, description="adarag settings.")
    max_new_tokens: int = Field(default=256, ge=1, description="Answer length cap.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy.")
    _rag: AdaRAG = PrivateAttr()

    def __init__(self, rag: AdaRAG | None = None, **kwargs: Any) -> None:
        if rag is not None:
            kwargs.setdefault("config", rag.config)
        super().__init__(**kwargs)
        self._rag = rag or AdaRAG(self.config)

    @classmethod
    def class_name(cls) -> str:
        """Name of the component."""
        return "AdaRagLLM"

    @property
    def rag(self) -> AdaRAG:
        """The pipeline whose model answers (share it with AdaptiveCachedQueryEngine)."""
        return self._rag

    @property
    def metadata(self) -> LLMMetadata:
        """Context window, output cap and model name."""
        spec = self._rag.engine.spec
        return LLMMetadata(
            context_window=self.config.engine.max_context_tokens or spec.max_position_embeddings,
            num_output=self.max_new_tokens,
            is_chat_model=True,
            model_name=self._rag.model_name,
        )

    # --- completion

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt``."""
        prompt_value = self._completion_prompt(prompt, formatted)
        answer = self._rag.generate(prompt_value, params=self._params(kwargs)).answer()
        return CompletionResponse(text=answer.text, raw=_usage(answer))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """Answer ``prompt`` delta by delta; the last response carries the usage."""
        prompt_value = self._completion_prompt(prompt, formatted)
        stream = self._rag.generate(prompt_value, params=self._params(kwargs))

        def gen() -> Generator[CompletionResponse, None, None]:
            for delta in stream:
                yield CompletionResponse(text=stream.text, delta=delta)
            answer = stream.answer()
            yield CompletionResponse(text=stream.text, delta="", raw=_usage(answer))

        return gen()

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async :meth:`complete`."""
        stream = await self._rag.agenerate(
            self._completion_prompt(prompt, formatted), params=self._params(kwargs)
        )
        answer = await stream.answer()
        return CompletionResponse(text=answer.text, raw=_usage(answer))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`."""
        stream = await self._rag.agenerate(
            self._completion_prompt(prompt, formatted), params=self._params(kwargs)
        )

        async def gen() -> AsyncGenerator[CompletionResponse, None]:
            async for delta in stream:
                yield CompletionResponse(text=stream.stream.text, delta=delta)
            answer = await stream.answer()
            yield CompletionResponse(text=stream.stream.text, delta="", raw=_usage(answer))

        return gen()

    # --- chat

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer the conversation."""
        stream = self._chat_stream(messages, kwargs)
        answer = stream.answer()
        return ChatResponse(message=_assistant(answer.text), raw=_usage(answer))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Answer the conversation delta by delta; the last response carries the usage."""
        stream = self._chat_stream(messages, kwargs)

        def gen() -> Generator[ChatResponse, None, None]:
            for delta in stream:
                yield ChatResponse(message=_assistant(stream.text), delta=delta)
            answer = stream.answer()
            yield ChatResponse(message=_assistant(stream.text), delta="", raw=_usage(answer))

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`."""
        stream = await self._achat_stream(messages, kwargs)
        answer = await stream.answer()
        return ChatResponse(message=_assistant(answer.text), raw=_usage(answer))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`."""
        stream = await self._achat_stream(messages, kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            async for delta in stream:
                yield ChatResponse(message=_assistant(stream.stream.text), delta=delta)
            answer = await stream.answer()
            text = stream.stream.text
            yield ChatResponse(message=_assistant(text), delta="", raw=_usage(answer))

        return gen()

    # --- internals

    def _chat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> AnswerStream:
        """The answer to ``messages``, prefilled, ready to decode."""
        return self._rag.generate(self._chat_prompt(messages), params=self._params(kwargs))

    async def _achat_stream(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> AsyncAnswerStream:
        """Async :meth:`_chat_stream` (the prefill runs in a worker thread)."""
        return await self._rag.agenerate(self._chat_prompt(messages), params=self._params(kwargs))

    def _params(self, kwargs: dict[str, Any]) -> GenerationParams:
        """Decoding options: the fields, overridden per call.

        ``max_tokens`` (or ``max_new_tokens``), ``temperature`` and ``stop`` apply; other
        keywords are ignored, as LlamaIndex LLMs do.
        """
        max_new_tokens = kwargs.get("max_tokens", kwargs.get("max_new_tokens"))
        return GenerationParams(
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            temperature=kwargs.get("temperature", self.temperature),
            stop=tuple(kwargs.get("stop") or ()),
        )

    def _completion_prompt(self, prompt: str, formatted: bool) -> Prompt:
        if formatted:
            return prompt
        to_prompt = self.completion_to_prompt
        if to_prompt is not None and to_prompt is not default_completion_to_prompt:
            return to_prompt(prompt)
        return self._chat_prompt([ChatMessage(role=MessageRole.USER, content=prompt)])

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> Prompt:
        rendered = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        if self.system_prompt and not any(m["role"] == "system" for m in rendered):
            rendered.insert(0, {"role": "system", "content": self.system_prompt})
        return rendered


def _assistant(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


def _usage(answer: Answer) -> dict[str, Any]:
    return {"usage": token_usage(answer)}
