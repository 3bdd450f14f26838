"""ChatAdaRag: adarag's local engine as a LangChain chat model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import Field, PrivateAttr

from adarag import AdaRAG, AdaRagConfig, Answer, GenerationParams
from langchain_adarag._context_prompt import ContextPrompt, find_context
from langchain_adarag._convert import chat_messages, usage_metadata

TOOLS_UNSUPPORTED = (
    "ChatAdaRag does not support tool calling: adarag decodes plain text and has no tool-call "
    "format or parser, and its small local models are not trained to call tools. Call the "
    "tools in your own code and pass their results in the messages, or give the agent a "
    "tool-calling chat model and use adarag for the retrieval-grounded answers "
    "(AdaptiveCachedRAG as a tool)"
)
STRUCTURED_OUTPUT_UNSUPPORTED = (
    "ChatAdaRag does not support with_structured_output: adarag has no constrained (JSON "
    "schema) decoding, so the output of its small local models is not guaranteed to parse. "
    "Ask for the format in the prompt and parse the text (PydanticOutputParser, "
    "JsonOutputParser), handling failures"
)


MAX_CONTEXT_PIPELINES = 8
"""Prompt layouts (system prompt and context opening) a chat model keeps ready."""


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

    Use with a retriever (the textbook chain; each document's cached KV is reused):
        >>> prompt = ChatPromptTemplate.from_template(TEMPLATE)  # "...{context}...{question}"
        >>> chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
        ...          | prompt | model | StrOutputParser())

    The documents are found in the (one) human message when ``format_docs`` joins them with a
    blank line (``prompt.chunk_separator``), the first starts a line, and adarag holds their KV
    (``adarag ingest`` warms a knowledge base's chunks, ``AdaptiveCachedRAG.warm(documents)``
    any documents); the text after them is the question. Such a prompt is answered with its
    text unchanged, each document's KV reused (``usage_metadata["input_token_details"]
    ["cache_read"]``); a system message is the system prompt, and without one adarag's system
    prompt is used instead of the template's default.

    Usage is on the message (``usage_metadata``, on the last chunk when streaming), under the
    checkpoint's name (``response_metadata["model_name"]``). ``get_num_tokens`` counts with the
    model's tokenizer, ``get_num_tokens_from_messages`` the messages as given in the chat
    template (no default system prompt, no assistant header), so counts add up and
    ``trim_messages(token_counter=model)`` keeps what fits. ``bind_tools`` and
    ``with_structured_output`` raise ``NotImplementedError`` saying why.
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
    _context_pipelines: dict[tuple[str | None, str], AdaRAG] = PrivateAttr(default_factory=dict)
    _header_tokens: int | None = PrivateAttr(default=None)

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
            "model_name": self._rag.model_name,
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
        return self._result(self._start(messages, params).answer(), params)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        params = self._params(stop, **kwargs)
        stream = await self._astart(messages, params)
        return self._result(await stream.answer(), params)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        params = self._params(stop, **kwargs)
        stream = self._start(messages, params)
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
        stream = await self._astart(messages, params)
        async for delta in stream:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager is not None:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield self._last_chunk(await stream.answer(), params)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "adarag"
        params["ls_model_name"] = self._rag.model_name
        return params

    # --- tokens

    def get_token_ids(self, text: str) -> list[int]:
        """The model's token ids of ``text`` (no special tokens)."""
        return list(self._rag.tokenizer.encode(text, add_special_tokens=False))

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Tokens of ``messages`` as given, in the model's chat template.

        Counts add up: the count of a list is the sum of its messages' counts, so
        ``trim_messages(token_counter=model)`` keeps what fits. So a list is counted without
        the default system prompt the template adds to a list without one (SmolLM2's "You are
        a helpful AI assistant named SmolLM...") and without the assistant header the prompt
        ends with (a few tokens, the same for every prompt; ``usage_metadata["input_tokens"]``
        of an answer includes it).

        Raises:
            NotImplementedError: ``tools`` are given (tool calling is not supported).
        """
        if tools:
            raise NotImplementedError(TOOLS_UNSUPPORTED)
        return self._num_chat_ids(chat_messages(messages)) - self._assistant_header_tokens()

    # --- not supported

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, Any]:
        """Not supported.

        Raises:
            NotImplementedError: Always, saying why and what to do instead.
        """
        raise NotImplementedError(TOOLS_UNSUPPORTED)

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Runnable[Any, Any]:
        """Not supported.

        Raises:
            NotImplementedError: Always, saying why and what to do instead.
        """
        raise NotImplementedError(STRUCTURED_OUTPUT_UNSUPPORTED)

    # --- internals

    def _num_chat_ids(self, messages: list[dict[str, str]]) -> int:
        return len(self._rag.prompts.chat_ids(messages, add_default_system=False))

    def _assistant_header_tokens(self) -> int:
        """Tokens the template adds once per prompt, after its messages (the assistant header)."""
        if self._header_tokens is None:
            one = [{"role": "user", "content": "Hello."}]
            self._header_tokens = 2 * self._num_chat_ids(one) - self._num_chat_ids(one + one)
        return self._header_tokens

    def _start(self, messages: list[BaseMessage], params: GenerationParams) -> Any:
        """Prefill ``messages``: with the KV of the documents they hold, when cached."""
        found = find_context(self._rag, messages)
        if found is None:
            return self._rag.generate(chat_messages(messages), params=params)
        pipeline = self._context_pipeline(found)
        return pipeline.stream(found.question, chunks=list(found.chunks), params=params)

    async def _astart(self, messages: list[BaseMessage], params: GenerationParams) -> Any:
        """Async :meth:`_start`."""
        found = find_context(self._rag, messages)
        if found is None:
            return await self._rag.agenerate(chat_messages(messages), params=params)
        pipeline = self._context_pipeline(found)
        return await pipeline.astream(found.question, chunks=list(found.chunks), params=params)

    def _context_pipeline(self, found: ContextPrompt) -> AdaRAG:
        """The pipeline whose prompt layout is ``found``'s text (sharing the engine and cache)."""
        key = (found.system_prompt, found.context_intro)
        if key not in self._context_pipelines:
            if len(self._context_pipelines) >= MAX_CONTEXT_PIPELINES:
                self._context_pipelines.pop(next(iter(self._context_pipelines)))
            system_prompt = found.system_prompt
            prompt: dict[str, Any] = {
                "context_intro": found.context_intro,
                "question_template": "{question}",
                "citations": False,
            }
            if system_prompt is not None:
                prompt["system_prompt"] = system_prompt
            self._context_pipelines[key] = self._rag.with_config(
                prompt=prompt, augment={"enabled": False}
            )
        return self._context_pipelines[key]

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
            "model_name": self._rag.model_name,
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
