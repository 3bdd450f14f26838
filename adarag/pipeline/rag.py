"""AdaRAG: the one class that wires retrieval, the chunk-KV cache, augmentation and a generator."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.cache.store import StoreStats, TieredKVStore
from adarag.cache.tiers import TieredCache, TierStats
from adarag.config import AdaRagConfig
from adarag.engine.generator import Generator
from adarag.pipeline.context import check_question, numbered, request_context, retrieve
from adarag.pipeline.controller import build_controller, static_fallback_message
from adarag.pipeline.decode import decoder, plain_answer
from adarag.pipeline.fusion import FusionWarmer
from adarag.pipeline.prompt import PromptBuilder, Turn, condense_prompt, retrieval_query
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.pipeline.stream import AnswerStream, AsyncAnswerStream, DecodeSteps, no_context
from adarag.policies import policy_config
from adarag.profiles import ModelProfile
from adarag.retrievers.base import Retriever
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Answer, Chunk, GenerationParams, PromptLayout, StepTrace

__all__ = ["AdaRAG", "CacheReport"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheReport:
    """Cache statistics: tier hits and recomputed tokens, store sizes and events."""

    tiers: TierStats
    store: StoreStats


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
        self._resources = Resources(built or AdaRagConfig(), generator, engine_lock)
        self.retriever = retriever
        self._logged_static = False

    @classmethod
    def from_policy(
        cls,
        name: str,
        config: AdaRagConfig | None = None,
        *,
        retriever: Retriever | None = None,
        generator: Generator | None = None,
        **overrides: Any,
    ) -> AdaRAG:
        """A pipeline configured by a named policy (``adarag.policies.POLICIES``).

        Example:
            >>> rag = AdaRAG.from_policy("ragboost", retriever=retriever)
            >>> rag = AdaRAG.from_policy("adacache", cache={"store": {"max_memory_mb": 512}})

        Args:
            name: The policy, e.g. ``"adacache"``, ``"cacheblend"``, ``"fusionrag"``.
            config: The configuration the policy's overrides apply to; defaults when None.
            retriever: Where chunks come from when a call passes none.
            generator: A ready generator (shares its weights); built from the config when None.
            **overrides: Config overrides applied over the policy's.

        Raises:
            ConfigError: No policy has that name (the message lists the known ones), or an
                override is invalid.
        """
        return cls(
            policy_config(name, config, **overrides), retriever=retriever, generator=generator
        )

    @property
    def config(self) -> AdaRagConfig:
        """The configuration."""
        return self._resources.config

    @config.setter
    def config(self, config: AdaRagConfig) -> None:
        self._resources.config = config

    @property
    def _engine_lock(self) -> threading.RLock:
        """The lock serialising engine work (shared by :meth:`with_config`)."""
        return self._resources.engine_lock

    @property
    def generator(self) -> Generator:
        """The backend generator (loaded on first use)."""
        return self._resources.generator

    @property
    def model_name(self) -> str:
        """The checkpoint's name (``SmolLM2-135M-Instruct``), for traces and usage (loads it)."""
        return str(self.generator.checkpoint.name)

    @property
    def profile(self) -> ModelProfile:
        """The model's attention-sink profile and calibration (generic when never profiled)."""
        return self._resources.profile

    @property
    def kv_namespace(self) -> str:
        """What stored chunk KV is bound to besides its token ids.

        The checkpoint, the dtype KV is computed in and the dtype it is stored in: the disk
        tier's directory name, and part of every cache key. The system prompt, template and
        separator are bound through the token ids of the system prefix and of each chunk.
        """
        return self._resources.kv_namespace

    @property
    def cache(self) -> TieredCache:
        """The three-tier chunk-KV cache of this model (opened on first use)."""
        return self._resources.cache

    @property
    def kv_directory(self) -> Path:
        """The disk tier's directory: ``<cache.store.directory or home/kv>/<kv_namespace>``."""
        return self._resources.kv_directory

    @property
    def cache_disk_problem(self) -> str | None:
        """Why chunk KV is not written to the disk tier now (a full or read-only file system).

        None while the disk tier takes writes, has none, or the cache is not opened yet.
        """
        store = self._resources.opened_store
        return None if store is None else store.disk_problem

    def cache_stats(self) -> CacheReport:
        """Hits per tier, recomputed tokens, and the store's sizes and evictions."""
        cache = self.cache
        store = cache.store
        store_stats = store.snapshot() if isinstance(store, TieredKVStore) else StoreStats()
        return CacheReport(cache.stats, store_stats)

    def close(self) -> None:
        """Write memory-only cache entries to disk, so a later process reuses them."""
        cache = self._resources.opened_cache
        if cache is not None:
            store = cache.store
            if isinstance(store, TieredKVStore):
                store.flush()

    def __enter__(self) -> AdaRAG:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def prompts(self) -> PromptBuilder:
        """The prompt builder for this pipeline's ``config.prompt`` (the only layout maker)."""
        return self._resources.prompts

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (for token-sized chunking and counting)."""
        return self.generator.tokenizer

    def with_config(self, **overrides: Any) -> AdaRAG:
        """A pipeline with config overrides that shares this one's generator and engine lock.

        Example:
            >>> terse = rag.with_config(prompt={"system_prompt": "Answer in one word."})

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        resources = self._resources.derive(AdaRagConfig.build(self.config, **overrides))
        clone = AdaRAG(resources.config, retriever=self.retriever)
        clone._resources = resources  # the generator, engine lock and (same config) store shared
        return clone

    # --- retrieval and warming

    def retrieve(self, question: str, top_k: int | None = None) -> list[Chunk]:
        """The retriever's top-k chunks for ``question``.

        Raises:
            ConfigError: No retriever was given.
            InputError: The question is empty, or top_k is not positive or above
                ``retrieval.max_top_k`` (refused before the retriever is asked).
        """
        return retrieve(self.retriever, self.config, question, top_k)

    def standalone_question(self, question: str, history: Sequence[Turn] = ()) -> str:
        """What a conversation's ``question`` is retrieved with (``chat.standalone_question``).

        ``"turns"``: the earlier questions, this one, then the earlier answers
        (:func:`retrieval_query` with answers), so a follow-up finds what an earlier answer
        named; ``"concatenate"``: the earlier questions, then this one; ``"condense"``: the
        model's rewrite of the question and the earlier turns as one standalone question
        (greedy, at most ``chat.max_condense_tokens`` tokens; its first line), or the turns
        when the rewrite comes out empty. Without history it is ``question`` itself.
        """
        chat = self.config.chat
        if not history or chat.standalone_question != "condense":
            return retrieval_query(
                question, history, with_answers=chat.standalone_question == "turns"
            )
        prompt = condense_prompt(chat.condense_prompt, question, history)
        params = GenerationParams(max_new_tokens=chat.max_condense_tokens)
        rewrite = self.generate([{"role": "user", "content": prompt}], params=params).answer()
        lines = [line.strip() for line in rewrite.text.strip().splitlines() if line.strip()]
        if not lines:
            logger.warning("the condensed question came out empty; retrieving with the turns")
            return retrieval_query(question, history, with_answers=True)
        return lines[0]

    def warm(self, chunks: Sequence[Chunk | str]) -> int:
        """Precompute the independent KV of chunks not cached yet; returns how many were new.

        With ``cache.fusion`` on, each chunk's fused KV (computed after its most similar chunks
        in the retriever, or among ``chunks`` when there is no retriever) is stored too; a chunk
        counts as new when either entry was computed. Entries go to the disk tier at once, so
        they survive restarts.
        """
        system_kv = self._resources.system_kv()
        given = [chunk if isinstance(chunk, Chunk) else Chunk(chunk) for chunk in chunks]
        new = set()
        for chunk in given:
            ids = self.prompts.chunk_ids(chunk.text)
            if not self.cache.has_independent(ids):
                self._resources.independent_kv(ids)
                new.add(chunk.text)
        if self.config.cache.fusion.enabled and given:
            warmer = FusionWarmer(
                self.config.cache.fusion,
                self.generator,
                self.cache,
                self.prompts,
                system_kv,
                self._resources.independent_kv,
            )
            finder = self.retriever or MemoryRetriever(given)
            with self._engine_lock:
                for chunk in given:
                    if warmer.warm([chunk], finder):
                        new.add(chunk.text)
        return len(new)

    # --- answering

    def query(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
        history: Sequence[Turn] = (),
        conversation_chunks: Sequence[Chunk | str] = (),
    ) -> Answer:
        """Answer ``question`` from ``chunks`` (or the retriever's top-k)."""
        return self.stream(
            question,
            chunks=chunks,
            params=params,
            top_k=top_k,
            history=history,
            conversation_chunks=conversation_chunks,
        ).answer()

    def stream(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
        history: Sequence[Turn] = (),
        conversation_chunks: Sequence[Chunk | str] = (),
    ) -> AnswerStream:
        """Retrieve and prefill now; return a stream of answer text deltas.

        Args:
            question: What to answer.
            chunks: The context; the retriever's top-k when None.
            params: Decoding options.
            top_k: Chunks to retrieve (``retrieval.top_k`` when None).
            history: Earlier turns of a conversation, oldest first, as (message, answer) pairs:
                they go into the prompt as chat turns after the context (the system prefix and
                the chunks' KV stay reusable), and the retriever searches for their messages
                together with ``question``. Pass only the turns to carry (see
                :class:`~adarag.conversation.Conversation`).
            conversation_chunks: The conversation's context so far in listed order (the last
                answer's ``chunks``); with ``chat.deduplicate`` it opens this turn's context and
                only retrieved chunks not in it are added.
        """
        _ = self.generator  # loads the model once, outside the timed request
        started = time.perf_counter()
        params = params or GenerationParams()
        check_question(question)
        if chunks is None:
            found = self.retrieve(self.standalone_question(question, history), top_k)
        else:
            found = [c if isinstance(c, Chunk) else Chunk(c) for c in chunks]
        retrieval_s = time.perf_counter() - started
        context = request_context(
            self._resources, question, found, params, history, conversation_chunks
        )
        if context.layout is None:
            prepared = no_context(retrieval_s)
        else:
            augmented = self._augmented()
            prepared = augmented.run(context.layout, context.chunks, params, started, retrieval_s)
        if context.num_dropped:
            prepared.trace = dataclasses.replace(
                prepared.trace, num_dropped_chunks=context.num_dropped
            )
        if self.config.prompt.citations:
            prepared.chunks = numbered(prepared.chunks)
        if context.note:
            prepared.trace = dataclasses.replace(prepared.trace, order_hint=context.note)
        return AnswerStream(prepared, self._decoder(params))

    def schedule(self, requests: Sequence[Sequence[Chunk | str]]) -> list[int]:
        """The order to run a batch of requests in, prefix-sharing ones back to back.

        RAGBoost's scheduling: requests that share chunks form groups (largest first), and each
        group's shared chunks get one order, recorded in the hard tier's context index, so with
        ``cache.reorder = "longest_prefix"`` each request after the first in a group lists them
        first and finds them cached.

        Args:
            requests: Each request's chunks in the retriever's order.

        Returns:
            Indices into ``requests`` in the order to run them.
        """
        prompts = self.prompts
        chunk_ids = [
            [prompts.chunk_ids(c.text if isinstance(c, Chunk) else c) for c in chunks]
            for chunks in requests
        ]
        with self._engine_lock:
            return self.cache.plan(chunk_ids)

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
        augmented = self._augmented(static_fallback=False)
        return augmented.each_step(self.layout(question, chunks, params), params)

    def layout(
        self,
        question: str,
        chunks: Sequence[Chunk | str],
        params: GenerationParams | None = None,
    ) -> PromptLayout:
        """The prompt ``system + chunks + question`` as token segments, checked to fit.

        Raises:
            InputError: The question or a chunk is empty, or the prompt and
                ``params.max_new_tokens`` exceed the model's context.
        """
        texts = [c.text if isinstance(c, Chunk) else c for c in chunks]
        layout = self.prompts.layout(question, texts)
        self.generator.check_fits(layout, (params or GenerationParams()).max_new_tokens)
        return layout

    async def aquery(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
        history: Sequence[Turn] = (),
        conversation_chunks: Sequence[Chunk | str] = (),
    ) -> Answer:
        """Async :meth:`query`; the work runs in a worker thread, never on the event loop."""
        return await asyncio.to_thread(
            self.query,
            question,
            chunks=chunks,
            params=params,
            top_k=top_k,
            history=history,
            conversation_chunks=conversation_chunks,
        )

    async def astream(
        self,
        question: str,
        *,
        chunks: Sequence[Chunk | str] | None = None,
        params: GenerationParams | None = None,
        top_k: int | None = None,
        history: Sequence[Turn] = (),
        conversation_chunks: Sequence[Chunk | str] = (),
    ) -> AsyncAnswerStream:
        """Async :meth:`stream`; prefill and each decode step run in a worker thread."""
        stream = await asyncio.to_thread(
            self.stream,
            question,
            chunks=chunks,
            params=params,
            top_k=top_k,
            history=history,
            conversation_chunks=conversation_chunks,
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
        prepared = plain_answer(generator, self._engine_lock, self.prompts, prompt, params, started)
        return AnswerStream(prepared, self._decoder(params))

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

    def _augmented(self, *, static_fallback: bool = True) -> AugmentedPrefill:
        """The augmentation loop; an uncalibrated agreement rule falls back to static top-k."""
        augment = self.config.augment
        agreement = self.profile.calibration.agreement
        uncalibrated = agreement is None or agreement.threshold is None
        rule = augment.stop_rule
        if static_fallback and augment.enabled and rule == "agreement" and uncalibrated:
            if not self._logged_static:
                self._logged_static = True
                # the documented default of both packaged models, not a fault: info, not warning
                logger.info(static_fallback_message(self.profile.model, agreement))
            augment = augment.model_copy(update={"enabled": False})
        return AugmentedPrefill(
            self.generator,
            self.cache,
            self.config.cache,
            augment,
            build_controller(
                self.config.augment, self.generator.spec.num_layers, self.profile.calibration
            ),
            self._engine_lock,
            self._resources.system_kv,
        )

    def _decoder(self, params: GenerationParams) -> DecodeSteps:
        """Decodes a prepared answer with ``params``."""
        return decoder(self.generator, self._engine_lock, params)
