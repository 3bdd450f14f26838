"""AdaptiveCachedQueryEngine: a LlamaIndex query engine that answers with adarag."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable, Iterator
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.instrumentation.events.synthesis import (
    SynthesizeEndEvent,
    SynthesizeStartEvent,
)
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.prompts.mixin import PromptDictType, PromptMixin, PromptMixinType
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle
from llama_index.packs.adarag.chat_engine import AdaptiveChatEngine
from llama_index.packs.adarag.llm_events import PreparedAnswerLLM, prompt_messages
from llama_index.packs.adarag.prompts import prompt_overrides, template_from_config
from llama_index.packs.adarag.response import METADATA_KEY, chunks_from_nodes, describe
from llama_index.packs.adarag.retriever import AdaRagRetriever

from adarag import AdaRAG, ConfigError, GenerationParams
from adarag.retrievers import ChromaRetriever, KnowledgeBase, SentenceEmbedder

dispatcher = instrument.get_dispatcher(__name__)
logger = logging.getLogger(__name__)

QA_PROMPT_KEY = "text_qa_template"
SYNTHESIZER_MODULE = "response_synthesizer"
ONE_PASS_MODES = ("compact", "simple_summarize")


class AdaptiveCachedQueryEngine(BaseQueryEngine):
    """Retrieve once, reuse chunk KV, add chunks until confident, answer with a local model.

    Setup:
        ``pip install -e integrations/llama_index`` (``make install`` does it).

    Instantiate:
        >>> from adarag import AdaRAG
        >>> from llama_index.packs.adarag import AdaptiveCachedQueryEngine
        >>> rag = AdaRAG()  # the model, loaded once and shared
        >>> engine = AdaptiveCachedQueryEngine.from_index(index, rag, similarity_top_k=4)
        >>> engine = AdaptiveCachedQueryEngine.from_chroma_collection(collection, rag)
        >>> engine = AdaptiveCachedQueryEngine(any_llama_index_retriever, rag)

    Query:
        >>> response = engine.query("Who directed Aas Ka Panchhi?")
        >>> response.source_nodes  # the chunks the answer was conditioned on, with scores
        >>> response.metadata["adarag"]["usage"]  # prompt, completion and cached tokens

    Warm (precompute the chunk KV of indexed nodes, so their first query is a cache hit):
        >>> engine.warm_index(index)  # or engine.warm(nodes)

    Stream (``streaming=True``; ``source_nodes`` are known before the first token):
        >>> for token in engine.query("...").response_gen: print(token, end="")

    Async (retrieval and every engine step run in worker threads; concurrent queries are
    serialised step by step by the pipeline's engine lock):
        >>> response = await engine.aquery("...")

    Use with LlamaIndex:
        >>> QueryEngineTool.from_defaults(engine, name="wiki", description="...")
        >>> CondenseQuestionChatEngine.from_defaults(query_engine=engine)

    Response metadata holds ``{node_id: node.metadata}`` for the nodes used (the synthesizers'
    convention) and, under ``"adarag"``, the augmentation trace: steps (chunks, confidence,
    tiers, recomputed tokens), stop reason, unused node ids, TTFT and token usage.

    Args:
        retriever: Any LlamaIndex retriever; its top-k are the candidate chunks.
        rag: The adarag pipeline (shares the model); built from defaults when None.
        text_qa_template: QA template with ``{context_str}`` before ``{query_str}``.
        streaming: Return streaming responses.
        max_new_tokens: Answer length cap.
        temperature: Sampling temperature; 0 is greedy.
        node_postprocessors: Applied in order to the retrieved nodes (filters, rerankers);
            what they keep, in their order, are the candidate chunks.
        response_mode: ``"compact"`` (or ``"simple_summarize"``): one pass over the kept
            chunks, the only synthesis adarag does; other modes are refused.
        callback_manager: Legacy callbacks; ``Settings.callback_manager`` when None.
        citation_mode: Answer citing the passages as [1], [2] (LlamaIndex's
            ``CitationQueryEngine``): the prompt numbers the passages (``prompt.citations``)
            and each source node's metadata holds its number under ``"citation_number"``.
        response_synthesizer: Refused (adarag synthesises itself); accepted as a keyword so
            code written for ``RetrieverQueryEngine`` gets a clear error.

    Raises:
        ConfigError: The QA template cannot be laid out as adarag segments, or a synthesis
            option other than one pass is asked for.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        rag: AdaRAG | None = None,
        *,
        text_qa_template: BasePromptTemplate | None = None,
        streaming: bool = False,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        node_postprocessors: list[BaseNodePostprocessor] | None = None,
        response_mode: str = "compact",
        callback_manager: CallbackManager | None = None,
        citation_mode: bool = False,
        response_synthesizer: Any = None,
    ) -> None:
        if str(getattr(response_mode, "value", response_mode)) not in ONE_PASS_MODES:
            raise ConfigError(
                f"response_mode {response_mode!r} is not supported: adarag answers in one pass "
                f"over the chunks it keeps ({' / '.join(ONE_PASS_MODES)}); drop the argument"
            )
        if response_synthesizer is not None:
            raise ConfigError(
                "response_synthesizer is not supported: adarag's own synthesis reuses the "
                "chunks' KV; set text_qa_template (or update_prompts) to change the prompt"
            )
        self._retriever = retriever
        self._postprocessors = list(node_postprocessors or [])
        self._base_rag = rag or AdaRAG()
        if citation_mode and not self._base_rag.config.prompt.citations:
            self._base_rag = self._base_rag.with_config(prompt={"citations": True})
        self._rag = self._base_rag
        self._qa_template: BasePromptTemplate = template_from_config(self._base_rag.config.prompt)
        self.streaming = streaming
        self.params = GenerationParams(max_new_tokens=max_new_tokens, temperature=temperature)
        super().__init__(callback_manager=callback_manager or Settings.callback_manager)
        self._retriever.callback_manager = self.callback_manager
        if text_qa_template is not None:
            self._update_prompts({QA_PROMPT_KEY: text_qa_template})

    # --- constructors (index.as_query_engine() always builds a RetrieverQueryEngine)

    @classmethod
    def from_args(
        cls, retriever: BaseRetriever, rag: AdaRAG | None = None, **kwargs: Any
    ) -> AdaptiveCachedQueryEngine:
        """The engine over any LlamaIndex retriever (same as the constructor)."""
        return cls(retriever, rag, **kwargs)

    @classmethod
    def from_index(
        cls,
        index: Any,
        rag: AdaRAG | None = None,
        *,
        similarity_top_k: int = 4,
        filters: Any = None,
        **kwargs: Any,
    ) -> AdaptiveCachedQueryEngine:
        """The engine over ``index.as_retriever(...)``, e.g. a ``VectorStoreIndex``."""
        retriever = index.as_retriever(similarity_top_k=similarity_top_k, filters=filters)
        return cls(retriever, rag, **kwargs)

    @classmethod
    def from_chroma_collection(
        cls,
        collection: Any,
        rag: AdaRAG | None = None,
        *,
        similarity_top_k: int = 4,
        embedding_model: str = "default",
        embedding_function: Any = None,
        min_top_score: float | None = None,
        where: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AdaptiveCachedQueryEngine:
        """The engine over a chromadb collection (written by adarag, LlamaIndex or others).

        Args:
            collection: A chromadb collection.
            rag: The adarag pipeline.
            similarity_top_k: Candidate chunks per question.
            embedding_model: The local sentence-transformers directory that embedded the
                collection (``"default"``: MiniLM).
            embedding_function: Instead of ``embedding_model``: the chromadb
                ``EmbeddingFunction`` (or adarag embedder) that embedded the collection, e.g.
                ``collection._embedding_function`` or the one passed to ``create_collection``.
            min_top_score: Best similarity below which a question gets the no-context answer.
            where: A Chroma metadata filter for every query, e.g. ``{"document_id": "d1"}``.
            **kwargs: Constructor options.

        Raises:
            ConfigError: Both ``embedding_model`` and ``embedding_function`` are given.
            KnowledgeBaseError: The collection holds vectors of another dimension or model.
        """
        if embedding_function is not None and embedding_model != "default":
            raise ConfigError(
                f"pass embedding_model ({embedding_model!r}) or embedding_function, not both: "
                "each names the model that embedded the collection"
            )
        chroma = ChromaRetriever(
            collection,
            embedding_function or SentenceEmbedder(embedding_model),
            min_top_score=min_top_score,
            where=where,
        )
        return cls(AdaRagRetriever(chroma, similarity_top_k), rag, **kwargs)

    @classmethod
    def from_knowledge_base(
        cls,
        knowledge_base: KnowledgeBase,
        rag: AdaRAG | None = None,
        *,
        similarity_top_k: int | None = None,
        **kwargs: Any,
    ) -> AdaptiveCachedQueryEngine:
        """The engine over an adarag knowledge base (``adarag ingest`` wrote it)."""
        rag = rag or AdaRAG()
        top_k = similarity_top_k or rag.config.retrieval.top_k
        return cls(AdaRagRetriever(knowledge_base, top_k), rag, **kwargs)

    def warm(self, nodes: Iterable[BaseNode | NodeWithScore]) -> int:
        """Precompute the chunk KV of nodes indexed by LlamaIndex; returns how many were new.

        The text is the one a query sends (``get_content(metadata_mode=LLM)``), so a later
        query finds every warmed node in the cache instead of computing it in full. Entries go
        to the disk tier and survive restarts. For a whole index use :meth:`warm_index`.
        """
        scored = [n if isinstance(n, NodeWithScore) else NodeWithScore(node=n) for n in nodes]
        if not scored:
            logger.warning(
                "warm() was given no nodes. A VectorStoreIndex over a vector store that keeps "
                "the text (Chroma, ...) has an empty docstore; use engine.warm_index(index)"
            )
        return self._rag.warm(chunks_from_nodes(scored))

    def warm_index(self, index: VectorStoreIndex) -> int:
        """Precompute the chunk KV of every node of ``index``; returns how many were new.

        The nodes come from ``index.docstore``, or, for an index over a vector store that keeps
        the text (Chroma and most others; their docstore stays empty), from the vector store.

        Raises:
            ConfigError: The vector store cannot list its nodes (pass them to :meth:`warm`).
        """
        nodes: list[BaseNode] = list(index.docstore.docs.values())
        store = index.vector_store
        if not nodes and store.stores_text:
            try:
                nodes = store.get_nodes(None)
            except NotImplementedError as err:
                raise ConfigError(
                    f"{type(store).__name__} cannot list its nodes, so the index cannot be "
                    "warmed whole; pass the nodes you inserted to engine.warm(nodes)"
                ) from err
        return self.warm(nodes)

    def as_chat_engine(self, max_turns: int = 2) -> AdaptiveChatEngine:
        """A chat engine over this engine, carrying earlier turns as chat turns.

        See :class:`AdaptiveChatEngine`.
        """
        return AdaptiveChatEngine(self, max_turns=max_turns)

    @property
    def rag(self) -> AdaRAG:
        """The adarag pipeline answering (with the current QA template)."""
        return self._rag

    # --- PromptMixin

    def _get_prompts(self) -> PromptDictType:
        return {QA_PROMPT_KEY: self._qa_template}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        own = {key: value for key, value in prompts.items() if ":" not in key}
        unused = sorted(set(own) - {QA_PROMPT_KEY})
        if unused:
            raise ConfigError(
                f"{unused} would not be used: adarag answers in one pass over the chunks it "
                f"keeps (LlamaIndex's compact mode) with {QA_PROMPT_KEY!r} only; update that one"
            )
        if QA_PROMPT_KEY in own:
            template = own[QA_PROMPT_KEY]
            self._rag = self._base_rag.with_config(prompt=prompt_overrides(template))
            self._qa_template = template

    def _get_prompt_modules(self) -> PromptMixinType:
        return {SYNTHESIZER_MODULE: _SynthesizerPrompts(self)}

    # --- retrieve / synthesize

    def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """The candidate nodes: the retriever's, through the node postprocessors."""
        nodes = self._retriever.retrieve(query_bundle)
        for postprocessor in self._postprocessors:
            nodes = postprocessor.postprocess_nodes(nodes, query_bundle=query_bundle)
        return nodes

    async def aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """The candidate nodes, retrieved in a worker thread (retrievers often block)."""
        return await asyncio.to_thread(self.retrieve, query_bundle)

    @dispatcher.span
    def synthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Any = None,
    ) -> RESPONSE_TYPE:
        """Answer from ``nodes``: adaptive prefill over their cached KV, then decoding."""
        dispatcher.event(SynthesizeStartEvent(query=query_bundle))
        with self.callback_manager.event(
            CBEventType.SYNTHESIZE, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            stream = self._rag.stream(
                query_bundle.query_str, chunks=chunks_from_nodes(nodes), params=self.params
            )
            used, metadata = describe(stream, nodes)
            llm = PreparedAnswerLLM(self._rag, stream, self.params, self.callback_manager)
            messages = prompt_messages(self._rag, stream, query_bundle.query_str, [])
            response: RESPONSE_TYPE
            if self.streaming:
                tokens = _deltas(llm.stream_chat(messages), metadata)
                response = StreamingResponse(tokens, source_nodes=used, metadata=metadata)
            else:
                reply = llm.chat(messages)
                metadata[METADATA_KEY]["usage"] = reply.raw["usage"]
                text = str(reply.message.content or "")
                response = Response(text, source_nodes=used, metadata=metadata)
            event.on_end(payload={EventPayload.RESPONSE: response})
        dispatcher.event(SynthesizeEndEvent(query=query_bundle, response=response))
        return response

    @dispatcher.span
    async def asynthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Any = None,
    ) -> RESPONSE_TYPE:
        """Async :meth:`synthesize`; the engine work runs in worker threads."""
        dispatcher.event(SynthesizeStartEvent(query=query_bundle))
        with self.callback_manager.event(
            CBEventType.SYNTHESIZE, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            stream = await self._rag.astream(
                query_bundle.query_str, chunks=chunks_from_nodes(nodes), params=self.params
            )
            used, metadata = describe(stream.stream, nodes)
            llm = PreparedAnswerLLM(self._rag, stream.stream, self.params, self.callback_manager)
            messages = prompt_messages(self._rag, stream.stream, query_bundle.query_str, [])
            response: RESPONSE_TYPE
            if self.streaming:
                tokens = _adeltas(await llm.astream_chat(messages), metadata)
                response = AsyncStreamingResponse(tokens, source_nodes=used, metadata=metadata)
            else:
                reply = await llm.achat(messages)
                metadata[METADATA_KEY]["usage"] = reply.raw["usage"]
                text = str(reply.message.content or "")
                response = Response(text, source_nodes=used, metadata=metadata)
            event.on_end(payload={EventPayload.RESPONSE: response})
        dispatcher.event(SynthesizeEndEvent(query=query_bundle, response=response))
        return response

    # --- BaseQueryEngine (DispatcherSpanMixin makes these spans)

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            response = self.synthesize(query_bundle, self.retrieve(query_bundle))
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            nodes = await self.aretrieve(query_bundle)
            response = await self.asynthesize(query_bundle, nodes)
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response


def _deltas(
    responses: Iterator[ChatResponse], metadata: dict[str, Any]
) -> Generator[str, None, None]:
    """The text deltas of a streamed chat; the usage goes into ``metadata`` at the end."""
    for reply in responses:
        if reply.delta:
            yield reply.delta
        if reply.raw:
            metadata[METADATA_KEY]["usage"] = reply.raw["usage"]


async def _adeltas(
    responses: AsyncIterator[ChatResponse], metadata: dict[str, Any]
) -> AsyncGenerator[str, None]:
    """Async :func:`_deltas`."""
    async for reply in responses:
        if reply.delta:
            yield reply.delta
        if reply.raw:
            metadata[METADATA_KEY]["usage"] = reply.raw["usage"]


class _SynthesizerPrompts(PromptMixin):
    """The QA template under ``response_synthesizer:text_qa_template``.

    The key LlamaIndex's guides use for query engines; listed once, as ``text_qa_template``.
    """

    def __init__(self, engine: AdaptiveCachedQueryEngine) -> None:
        self._engine = engine

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        self._engine._update_prompts(prompts)

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}
