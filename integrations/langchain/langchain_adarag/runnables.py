"""AdaptiveCachedRAG: retrieval and cache-accelerated generation in one LangChain Runnable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.callbacks.manager import adispatch_custom_event, dispatch_custom_event
from langchain_core.documents import Document
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers import BaseOutputParser
from langchain_core.prompt_values import ChatPromptValue, StringPromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from adarag import (
    AdaRAG,
    AdaRagConfig,
    AnswerStream,
    ConfigError,
    GenerationParams,
    InputError,
)
from langchain_adarag import _sources
from langchain_adarag._chat_run import AsyncChatRun, ChatRun, run_messages
from langchain_adarag._convert import conversation_turns, document_from_chunk, usage_metadata
from langchain_adarag.chat_models import ChatAdaRag
from langchain_adarag.retrievers import AdaptiveCachedRetriever

STEP_EVENT = "adarag_step"
CALL_OPTIONS = frozenset({"max_new_tokens", "temperature", "stop", "k"})
"""Options one call may set (``chain.bind(max_new_tokens=32)``, ``invoke(..., k=2)``)."""
OUTPUT_IS_A_DICT = (
    "AdaptiveCachedRAG returns a dict ({{input, context, answer, confidence, stop_reason, "
    "usage_metadata}}), as create_retrieval_chain does, and {parser} parses text; pipe the answer "
    "alone into it: chain.answer_only() | {parser}()"
)


class AdaptiveCachedRAG(RunnableSerializable[str | dict[str, Any], dict[str, Any]]):
    """Retrieve once, reuse chunk KV, add chunks until confident, answer with a local model.

    Setup:
        ``pip install -e integrations/langchain`` (``make install`` does it).

    Instantiate:
        >>> from adarag import AdaRAG
        >>> from langchain_adarag import AdaptiveCachedRAG
        >>> chain = AdaptiveCachedRAG(retriever=vectorstore.as_retriever(), rag=AdaRAG())
        >>> chain = AdaptiveCachedRAG(rag=AdaRAG(retriever=knowledge_base))

    Invoke (a question, or ``{"input": question, "k": 4, "chat_history": messages}``; earlier
    turns enter the prompt as chat turns and the retrieval query, so a message list kept per
    conversation, each turn appended as ``HumanMessage`` and ``AIMessage``, holds one):
        >>> out = chain.invoke("Who directed Aas Ka Panchhi?")
        >>> out["answer"], out["context"], out["confidence"], out["stop_reason"]
        >>> out["usage_metadata"]["input_token_details"]["cache_read"]

    Stream (the context chunk first, then answer deltas, then usage):
        >>> for chunk in chain.stream("..."): print(chunk.get("answer", ""), end="")

    Async (retrieval and every engine step run in worker threads; concurrent calls are
    serialised step by step by the pipeline's engine lock, so ``batch`` is serial too):
        >>> out = await chain.ainvoke("...")
        >>> async for event in chain.astream_events("...", version="v2"): ...

    Use with LangChain (the output is a dict, as ``create_retrieval_chain``'s; an output
    parser takes the answer alone, ``chain | StrOutputParser()`` is an error saying so):
        >>> chain.answer_only() | StrOutputParser()  # a Runnable[str, str]
        >>> {"question": RunnablePassthrough()} | prompt | chain.as_chat_model()

    Each augmentation step is also sent as a custom event named ``adarag_step``, and the
    generation is a child chat-model run named ``ChatAdaRag`` (``on_chat_model_start``,
    ``on_chat_model_stream`` per token, ``on_chat_model_end`` with the message's usage), so
    tracers and ``UsageMetadataCallbackHandler`` see it as any chat model's.

    Output keys are those of classic retrieval chains, ``input``, ``context`` (the Documents
    the answer was conditioned on, with ``score`` in their metadata) and ``answer``, plus
    ``confidence`` (None until adaptive augmentation computes one), ``stop_reason`` and
    ``usage_metadata``.
    """

    adarag_config: AdaRagConfig = Field(default_factory=AdaRagConfig)
    """adarag settings of a pipeline built here (ignored when ``rag`` is given)."""
    k: int | None = Field(default=None, ge=1)
    """Candidate chunks per question; None uses ``retrieval.top_k``."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Answer length cap."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature; 0 is greedy."""
    citations: bool = False
    """Answer citing the passages as [1], [2]: the prompt numbers them (``prompt.citations``)
    and each ``context`` Document's metadata holds its number under ``"citation_number"``."""
    name: str | None = "adarag"
    pipeline: Any = Field(default=None, exclude=True, repr=False)
    """The adarag pipeline (``rag``), kept when LangChain rebuilds the Runnable with configured
    fields (``configurable_fields``), so no second model is loaded."""
    source: Any = Field(default=None, exclude=True, repr=False)
    """The retriever given (``retriever``), kept on rebuilds likewise."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _source: _sources.Source | None = PrivateAttr(default=None)

    def __init__(self, *, rag: AdaRAG | None = None, retriever: Any = None, **kwargs: Any) -> None:
        """Build the Runnable.

        Args:
            rag: The adarag pipeline (shares its model); built from ``adarag_config`` when None.
            retriever: A LangChain ``BaseRetriever``, a Runnable from ``{"input", "chat_history"}``
                to Documents (``create_history_aware_retriever``'s), or an adarag ``Retriever``;
                the pipeline's own retriever when None.
            **kwargs: Fields.

        Raises:
            ConfigError: ``retriever`` is neither kind of retriever, or ``adarag_config``
                differs from the config of the ``rag`` given.
        """
        rag = rag or kwargs.pop("pipeline", None)
        retriever = retriever if retriever is not None else kwargs.pop("source", None)
        if rag is not None:
            config = kwargs.setdefault("adarag_config", rag.config)
            if config != rag.config:
                raise ConfigError(
                    "adarag_config differs from the config of the pipeline given; build the "
                    "Runnable on rag.with_config(...) instead of configuring adarag_config"
                )
        super().__init__(pipeline=rag, source=retriever, **kwargs)
        self.pipeline = rag or AdaRAG(self.adarag_config)
        if self.citations and not self.pipeline.config.prompt.citations:
            self.pipeline = self.pipeline.with_config(prompt={"citations": True})
            self.adarag_config = self.pipeline.config  # what a rebuild checks the pipeline by
        self._source = _sources.as_source(retriever)

    @property
    def rag(self) -> AdaRAG:
        """The adarag pipeline."""
        return self.pipeline

    def as_retriever(self, k: int | None = None) -> AdaptiveCachedRetriever:
        """A retriever returning the chunks adaptive augmentation keeps for a question."""
        return AdaptiveCachedRetriever(rag=self.rag, retriever=self._source, k=k or self.k)

    def warm(self, documents: Iterable[Document]) -> int:
        """Precompute the chunk KV of documents; returns how many were new.

        E.g. the documents added to a vector store: a later question that retrieves them
        finds their KV in the cache instead of computing it in full. Entries go to the disk
        tier and survive restarts.
        """
        return self.rag.warm([d.page_content for d in documents if d.page_content.strip()])

    def answer_only(self) -> Runnable[str | dict[str, Any], str]:
        """The same chain returning (and streaming) the answer text alone.

        For output parsers and chains that take text: ``chain.answer_only() |
        StrOutputParser()``; it is ``chain.pick("answer")``.
        """
        return self.pick("answer")

    def __or__(self, other: Any) -> Any:
        """``chain | next``; an output parser is refused: it parses text, the chain gives a dict.

        Raises:
            ConfigError: ``other`` is an output parser; the message names ``answer_only()``.
        """
        if isinstance(other, BaseOutputParser):
            raise ConfigError(OUTPUT_IS_A_DICT.format(parser=type(other).__name__))
        return super().__or__(other)

    def as_chat_model(self) -> ChatAdaRag:
        """The same model as a LangChain chat model."""
        return ChatAdaRag(rag=self.rag, temperature=self.temperature)

    # --- Runnable

    def invoke(
        self, input: str | dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Answer one question."""
        return self._call_with_config(self._invoke, input, config, **kwargs)

    async def ainvoke(
        self, input: str | dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Async :meth:`invoke`."""
        return await self._acall_with_config(self._ainvoke, input, config, **kwargs)

    def stream(
        self, input: str | dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[dict[str, Any]]:
        """Stream the context, then answer deltas, then usage."""
        yield from self._transform_stream_with_config(
            iter([input]), self._transform, config, **kwargs
        )

    async def astream(
        self, input: str | dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Async :meth:`stream`."""

        async def one() -> AsyncIterator[str | dict[str, Any]]:
            yield input

        async for chunk in self._atransform_stream_with_config(
            one(), self._atransform, config, **kwargs
        ):
            yield chunk

    # --- internals

    def _invoke(
        self,
        input: str | dict[str, Any],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **options: Any,
    ) -> dict[str, Any]:
        output = AddableDict()
        for chunk in self._transform(iter([input]), run_manager, config, **options):
            output = output + chunk
        return output

    async def _ainvoke(
        self,
        input: str | dict[str, Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **options: Any,
    ) -> dict[str, Any]:
        async def one() -> AsyncIterator[str | dict[str, Any]]:
            yield input

        output = AddableDict()
        async for chunk in self._atransform(one(), run_manager, config, **options):
            output = output + chunk
        return output

    def _transform(
        self,
        inputs: Iterator[str | dict[str, Any]],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **options: Any,
    ) -> Iterator[AddableDict]:
        params, default_k = self._options(options)
        for input in inputs:
            question, k, history = self._parse(input, default_k)
            callbacks = run_manager.get_child()
            chunks = _sources.retrieve(self.rag, self._source, question, history, k, callbacks)
            stream = self.rag.stream(question, chunks=chunks, params=params, history=history)
            for data in _step_events(stream):
                dispatch_custom_event(STEP_EVENT, data, config=config)
            yield _head(question, stream)
            messages = run_messages(self.rag, question, history, list(stream.chunks))
            run = ChatRun.start(callbacks, self.rag, messages, params)
            try:
                for delta in stream:
                    run.token(delta)
                    yield AddableDict(answer=delta)
            except BaseException as err:  # GeneratorExit included: the run is closed either way
                run.error(err)
                raise
            answer = stream.answer()
            run.end(answer)
            yield AddableDict(usage_metadata=usage_metadata(answer))

    async def _atransform(
        self,
        inputs: AsyncIterator[str | dict[str, Any]],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **options: Any,
    ) -> AsyncIterator[AddableDict]:
        params, default_k = self._options(options)
        async for input in inputs:
            question, k, history = self._parse(input, default_k)
            callbacks = run_manager.get_child()
            chunks = await _sources.aretrieve(
                self.rag, self._source, question, history, k, callbacks
            )
            stream = await self.rag.astream(question, chunks=chunks, params=params, history=history)
            for data in _step_events(stream.stream):
                await adispatch_custom_event(STEP_EVENT, data, config=config)
            yield _head(question, stream.stream)
            messages = run_messages(self.rag, question, history, list(stream.stream.chunks))
            run = await AsyncChatRun.start(callbacks, self.rag, messages, params)
            try:
                async for delta in stream:
                    await run.token(delta)
                    yield AddableDict(answer=delta)
            except BaseException as err:  # GeneratorExit included: the run is closed either way
                await run.error(err)
                raise
            answer = await stream.answer()
            await run.end(answer)
            yield AddableDict(usage_metadata=usage_metadata(answer))

    def _parse(self, input: Any, k: int) -> tuple[str, int, list[tuple[str, str]]]:
        """(question, k, earlier turns) of one input.

        A question; ``{"input" or "question": question, "k": int, "chat_history": messages}``;
        or a prompt's output (``prompt | chain``): a string prompt's text is the question, a
        chat prompt's last human message is, and its earlier turns are the history.
        """
        history: list[tuple[str, str]] = []
        if isinstance(input, StringPromptValue):
            question = input.to_string()
        elif isinstance(input, ChatPromptValue):
            messages = input.to_messages()
            if not messages or messages[-1].type != "human":
                raise InputError("a chat prompt for this chain must end with a human message")
            question = messages[-1].text
            history = conversation_turns(messages[:-1])
        elif isinstance(input, str):
            question = input
        elif isinstance(input, dict) and isinstance(_question(input), str):
            question, k = _question(input), int(input.get("k", k))
            history = conversation_turns(input.get("chat_history") or [])
        else:
            raise InputError(
                "expected a question, {'input': question, 'k': int, 'chat_history': messages} "
                f"('question' may name the question) or a prompt value, got {input!r:.80}"
            )
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        return question, k, history

    def _options(self, options: dict[str, Any]) -> tuple[GenerationParams, int]:
        """Decoding options and k for one call: the fields, overridden by ``.bind(...)``."""
        unknown = set(options) - CALL_OPTIONS
        if unknown:
            raise InputError(
                f"unknown call option(s) {sorted(unknown)}; this chain takes "
                f"{sorted(CALL_OPTIONS)} (e.g. chain.bind(max_new_tokens=32))"
            )
        k = options.get("k", self.k) or self.rag.config.retrieval.top_k
        params = GenerationParams(
            max_new_tokens=options.get("max_new_tokens", self.max_new_tokens),
            temperature=options.get("temperature", self.temperature),
            stop=tuple(options.get("stop") or ()),
        )
        return params, int(k)

    def get_output_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        """The output's keys and types (``get_output_jsonschema()``)."""
        return RAGOutput


class RAGOutput(BaseModel):
    """What :class:`AdaptiveCachedRAG` returns."""

    input: str = Field(description="The question.")
    context: list[Document] = Field(description="The chunks the answer was conditioned on.")
    answer: str = Field(description="The model's answer.")
    confidence: float | None = Field(description="The last augmentation step's confidence.")
    stop_reason: str = Field(description="Why augmentation stopped.")
    usage_metadata: UsageMetadata = Field(description="Prompt, completion and cached tokens.")


def _question(input: dict[str, Any]) -> Any:
    return input.get("input", input.get("question"))


def _head(question: str, stream: AnswerStream) -> AddableDict:
    """The first streamed chunk: question, context and the augmentation outcome."""
    steps = stream.trace.steps
    return AddableDict(
        input=question,
        context=[document_from_chunk(chunk) for chunk in stream.chunks],
        answer="",
        confidence=steps[-1].confidence if steps else None,
        stop_reason=stream.trace.stop_reason,
    )


def _step_events(stream: AnswerStream) -> list[dict[str, Any]]:
    return [
        {
            "step_idx": idx,
            "num_chunks": step.num_chunks,
            "confidence": step.confidence,
            "tiers": list(step.tiers),
            "num_recomputed_tokens": step.num_recomputed_tokens,
            "prefill_s": step.prefill_s,
            "stop_reason": stream.trace.stop_reason if idx == len(stream.trace.steps) - 1 else None,
        }
        for idx, step in enumerate(stream.trace.steps)
    ]
