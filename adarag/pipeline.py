"""AdaRAG: the one class that wires retrieval, the chunk-KV cache, augmentation and a generator."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from adarag.cache.entry import ChunkKV
from adarag.config import AdaRagConfig
from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.detokenizer import StreamingDetokenizer
from adarag.engine.interface import Generator, create_generator
from adarag.engine.prompt import PromptBuilder
from adarag.errors import ConfigError, InputError
from adarag.retrievers.base import Retriever
from adarag.schema import (
    Answer,
    Chunk,
    GenerationParams,
    PromptLayout,
    QueryTrace,
    StepTrace,
    Tier,
)

logger = logging.getLogger(__name__)

NO_CONTEXT_ANSWER = "I found no context for this question in the knowledge base."


@dataclass
class _Prepared:
    """A question after retrieval and prefill, ready to decode."""

    layout: PromptLayout | None
    output: PrefillOutput | None
    chunks: tuple[Chunk, ...]
    trace: QueryTrace
    num_cached_tokens: int


class AdaRAG:
    """Retrieval-augmented generation with chunk-KV reuse and adaptive context augmentation.

    Setup:
        ``make install`` (or ``pip install adarag``) provisions the default model offline.

    Instantiate:
        >>> from adarag import AdaRAG, Chunk
        >>> from adarag.retrievers import MemoryRetriever
        >>> rag = AdaRAG(retriever=MemoryRetriever([Chunk("Paris is the capital of France.")]))

    Query:
        >>> answer = rag.query("What is the capital of France?")
        >>> answer.text, answer.trace.ttft_s, [c.text for c in answer.chunks]

    Stream:
        >>> stream = rag.stream("What is the capital of France?")
        >>> stream.chunks  # known before the first token
        >>> for delta in stream: print(delta, end="")

    Async:
        >>> answer = await rag.aquery("What is the capital of France?")
        >>> async for delta in rag.astream("..."): ...

    Calls from several threads or tasks are safe: engine work (each prefill and each decode
    step) is serialised by one lock, so concurrent requests interleave step by step. Pipelines
    made with :meth:`with_config` share the generator and that lock.

    Args:
        config: The configuration; defaults when None.
        retriever: Where chunks come from when a call passes none.
        generator: A ready generator (shares its weights); built from ``config`` when None.
        engine_lock: The lock serialising engine work, shared with other pipelines that drive
            the same generator; a new one when None (see :meth:`with_config`).
        **overrides: Config overrides, e.g. ``cache={"soft": {"recompute_ratio": 0.05}}``.
    """

    def __init__(
        self,
        config: AdaRagConfig | None = None,
        *,
        retriever: Retriever | None = None,
        generator: Generator | None = None,
        engine_lock: threading.Lock | None = None,
        **overrides: Any,
    ) -> None:
        built = AdaRagConfig.build(config, **overrides) if overrides else config
        self.config: AdaRagConfig = built or AdaRagConfig()
        self.retriever = retriever
        self._generator = generator
        self._engine_lock = engine_lock or threading.Lock()
        self._system_kv: ChunkKV | None = None
        self._chunk_kv: dict[tuple[int, ...], ChunkKV] = {}

    @property
    def generator(self) -> Generator:
        """The backend generator (loaded on first use)."""
        if self._generator is None:
            with self._engine_lock:
                if self._generator is None:
                    self._generator = create_generator(self.config)
        return self._generator

    @cached_property
    def prompts(self) -> PromptBuilder:
        """The prompt builder for this pipeline's ``config.prompt``."""
        generator_prompts = self.generator.prompts
        if generator_prompts.config == self.config.prompt:
            return generator_prompts
        return PromptBuilder(generator_prompts.tokenizer, self.config.prompt)

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (for token-sized chunking and counting)."""
        return self.generator.prompts.tokenizer

    def with_config(self, **overrides: Any) -> AdaRAG:
        """A pipeline with config overrides that shares this one's generator and engine lock.

        Example:
            >>> terse = rag.with_config(prompt={"system_prompt": "Answer in one word."})

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        return AdaRAG(
            AdaRagConfig.build(self.config, **overrides),
            retriever=self.retriever,
            generator=self.generator,
            engine_lock=self._engine_lock,
        )

    # --- retrieval and warming

    def retrieve(self, question: str, top_k: int | None = None) -> list[Chunk]:
        """The retriever's top-k chunks for ``question``.

        Raises:
            ConfigError: No retriever was given.
            InputError: The question is empty or top_k is not positive.
        """
        if self.retriever is None:
            raise ConfigError("no retriever configured; pass retriever=... or chunks=[...]")
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        k = self.config.retrieval.top_k if top_k is None else top_k
        if k < 1:
            raise InputError(f"top_k must be at least 1, got {k}")
        return list(self.retriever.retrieve(question, k))

    def warm(self, chunks: Sequence[Chunk | str]) -> int:
        """Precompute the independent KV of chunks not cached yet; returns how many were new."""
        generator = self.generator
        system_kv = self._ensure_system_kv()
        computed = 0
        for chunk in chunks:
            text = chunk.text if isinstance(chunk, Chunk) else chunk
            ids = self.prompts.chunk_ids(text)
            if ids not in self._chunk_kv:
                with self._engine_lock:
                    self._chunk_kv[ids] = generator.compute_chunk(ids, system_kv)
                computed += 1
        return computed

    # --- answering

    def query(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
    ) -> Answer:
        """Answer ``question`` from ``chunks`` (or the retriever's top-k)."""
        return self.stream(question, chunks=chunks, params=params, top_k=top_k).answer()

    def stream(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
    ) -> AnswerStream:
        """Retrieve and prefill now; return a stream of answer text deltas."""
        _ = self.generator  # loads the model once, outside the timed request
        started = time.perf_counter()
        params = params or GenerationParams()
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        if chunks is None:
            found = self.retrieve(question, top_k)
        else:
            found = [c if isinstance(c, Chunk) else Chunk(c) for c in chunks]
        retrieval_s = time.perf_counter() - started
        if not found:
            return AnswerStream(self, _no_context(retrieval_s), params)
        prepared = self._prefill(question, found, params, started, retrieval_s)
        return AnswerStream(self, prepared, params)

    async def aquery(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
    ) -> Answer:
        """Async :meth:`query`; the work runs in a worker thread, never on the event loop."""
        return await asyncio.to_thread(
            self.query, question, chunks=chunks, params=params, top_k=top_k
        )

    async def astream(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
    ) -> AsyncAnswerStream:
        """Async :meth:`stream`; prefill and each decode step run in a worker thread."""
        stream = await asyncio.to_thread(
            self.stream, question, chunks=chunks, params=params, top_k=top_k
        )
        return AsyncAnswerStream(stream)

    def generate(
        self,
        prompt: str | Sequence[Mapping[str, str]],
        *,
        params: GenerationParams | None = None,
    ) -> AnswerStream:
        """Prefill a plain prompt now (no retrieval, no chunk KV); return a stream of deltas.

        Args:
            prompt: Text already in the model's format, or chat messages (``{"role", "content"}``
                mappings) rendered with the model's chat template.
            params: Decoding options.

        Raises:
            InputError: The prompt is empty or does not fit the context.
        """
        generator = self.generator
        started = time.perf_counter()
        params = params or GenerationParams()
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty; pass a non-empty prompt")
            ids = self.prompts.text_ids(prompt)
        else:
            ids = self.prompts.chat_ids(prompt)
        layout = PromptLayout((), (), ids)
        with self._engine_lock:
            output = generator.prefill(layout, max_new_tokens=params.max_new_tokens)
        prefill_s = time.perf_counter() - started
        step = StepTrace(
            num_chunks=0,
            confidence=None,
            kl_score=None,
            entropy_score=None,
            num_processed_tokens=output.num_processed_tokens,
            num_recomputed_tokens=output.num_recomputed_tokens,
            tiers=(),
            prefill_s=prefill_s,
            confidence_s=0.0,
        )
        trace = QueryTrace(
            steps=(step,), stop_reason="static", ttft_s=prefill_s, num_prompt_tokens=len(ids)
        )
        return AnswerStream(self, _Prepared(layout, output, (), trace, 0), params)

    async def agenerate(
        self,
        prompt: str | Sequence[Mapping[str, str]],
        *,
        params: GenerationParams | None = None,
    ) -> AsyncAnswerStream:
        """Async :meth:`generate`; prefill and each decode step run in a worker thread."""
        stream = await asyncio.to_thread(self.generate, prompt, params=params)
        return AsyncAnswerStream(stream)

    # --- internals

    def _ensure_system_kv(self) -> ChunkKV:
        if self._system_kv is None:
            generator = self.generator
            system_ids = self.prompts.system_ids
            with self._engine_lock:
                output = generator.prefill(PromptLayout((), (), system_ids))
            self._system_kv = output.kv.segment(0, len(system_ids))
        return self._system_kv

    def _prefill(
        self,
        question: str,
        chunks: Sequence[Chunk],
        params: GenerationParams,
        started: float,
        retrieval_s: float,
    ) -> _Prepared:
        generator = self.generator
        layout = self.prompts.layout(question, [chunk.text for chunk in chunks])
        generator.check_fits(layout, params.max_new_tokens)
        system_kv = self._ensure_system_kv()
        ratio = self.config.cache.independent.recompute_ratio
        sources = [SegmentSource(system_kv)]
        tiers: list[Tier] = []
        for ids in layout.chunk_ids:
            cached = self._chunk_kv.get(ids)
            sources.append(SegmentSource(cached, ratio) if cached else SegmentSource())
            tiers.append("independent" if cached else "miss")
        sources.append(SegmentSource())
        prefill_started = time.perf_counter()
        with self._engine_lock:
            output = generator.prefill(layout, sources, max_new_tokens=params.max_new_tokens)
        prefill_s = time.perf_counter() - prefill_started
        step = StepTrace(
            num_chunks=len(chunks),
            confidence=None,
            kl_score=None,
            entropy_score=None,
            num_processed_tokens=output.num_processed_tokens,
            num_recomputed_tokens=output.num_recomputed_tokens,
            tiers=tuple(tiers),
            prefill_s=prefill_s,
            confidence_s=0.0,
        )
        trace = QueryTrace(
            steps=(step,),
            stop_reason="static",
            ttft_s=time.perf_counter() - started,
            num_prompt_tokens=layout.num_tokens,
            retrieval_s=retrieval_s,
        )
        num_cached = layout.num_tokens - output.num_recomputed_tokens
        return _Prepared(layout, output, tuple(chunks), trace, num_cached)

    def _decode_steps(
        self, prepared: _Prepared, params: GenerationParams, counter: list[int]
    ) -> Iterator[str]:
        """Answer deltas, taking the engine lock for each decode step only."""
        assert prepared.layout is not None and prepared.output is not None
        tokens = self.generator.decode_tokens(prepared.layout, prepared.output, params)
        detokenizer = StreamingDetokenizer(self.generator.prompts.tokenizer, params.stop)
        while not detokenizer.stopped:
            with self._engine_lock:
                token = next(tokens, None)
            if token is None:
                break
            counter[0] += 1
            delta = detokenizer.push(token)
            if delta:
                yield delta
        tail = detokenizer.flush()
        if tail:
            yield tail


def _no_context(retrieval_s: float) -> _Prepared:
    trace = QueryTrace(
        steps=(), stop_reason="no_context", ttft_s=0.0, num_prompt_tokens=0, retrieval_s=retrieval_s
    )
    return _Prepared(None, None, (), trace, 0)


class AnswerStream(Iterator[str]):
    """Answer text deltas; ``chunks`` and ``trace`` are known before the first delta.

    Iterate it for deltas, or call :meth:`answer` for the whole :class:`Answer`.
    """

    def __init__(self, rag: AdaRAG, prepared: _Prepared, params: GenerationParams) -> None:
        self.chunks = prepared.chunks
        self.trace = prepared.trace
        self._prepared = prepared
        self._parts: list[str] = []
        self._num_tokens = [0]
        if prepared.output is None:
            self._deltas: Iterator[str] = iter([NO_CONTEXT_ANSWER])
        else:
            self._deltas = rag._decode_steps(prepared, params, self._num_tokens)

    def __next__(self) -> str:
        delta = next(self._deltas)
        self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        """The answer text streamed so far."""
        return "".join(self._parts)

    def answer(self) -> Answer:
        """Consume the rest of the stream and return the whole answer."""
        for _ in self:
            pass
        return Answer(
            text=self.text.strip(),
            chunks=self.chunks,
            trace=self.trace,
            num_completion_tokens=self._num_tokens[0],
            num_cached_tokens=self._prepared.num_cached_tokens,
        )


class AsyncAnswerStream(AsyncIterator[str]):
    """Async iteration over an :class:`AnswerStream`; each step runs in a worker thread."""

    def __init__(self, stream: AnswerStream) -> None:
        self.stream = stream
        self.chunks = stream.chunks
        self.trace = stream.trace

    async def __anext__(self) -> str:
        delta = await asyncio.to_thread(next, self.stream, None)
        if delta is None:
            raise StopAsyncIteration
        return delta

    async def answer(self) -> Answer:
        """Consume the rest of the stream and return the whole answer."""
        return await asyncio.to_thread(self.stream.answer)
