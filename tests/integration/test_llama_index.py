"""AdaptiveCachedQueryEngine and AdaRagLLM against real LlamaIndex objects and a real Chroma."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from contextlib import contextmanager

import pytest

pytest.importorskip("llama_index.packs.adarag")

import chromadb  # noqa: E402
import llama_index.core.instrumentation as instrument  # noqa: E402
from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.base.response.schema import (  # noqa: E402
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.bridge.pydantic import Field  # noqa: E402
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler  # noqa: E402
from llama_index.core.chat_engine import CondenseQuestionChatEngine  # noqa: E402
from llama_index.core.instrumentation.event_handlers import BaseEventHandler  # noqa: E402
from llama_index.core.instrumentation.span import SimpleSpan  # noqa: E402
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler  # noqa: E402
from llama_index.core.postprocessor import SimilarityPostprocessor  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.schema import QueryBundle  # noqa: E402
from llama_index.core.tools import QueryEngineTool  # noqa: E402
from llama_index.packs.adarag import (  # noqa: E402
    AdaptiveCachedQueryEngine,
    AdaRagEmbedding,
    AdaRagLLM,
)
from llama_index.vector_stores.chroma import ChromaVectorStore  # noqa: E402

from adarag import ConfigError  # noqa: E402
from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    FILM_QUESTION,
    LOTHAIR_QUESTION,
    UNRELATED_QUESTION,
    assert_used_prefix_of_retrieved,
    retrieved_titles,
)
from tests.integration.loop_probe import probe  # noqa: E402

pytestmark = pytest.mark.integration
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def engine(kb_rag, knowledge_base):
    return AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=3, max_new_tokens=MAX_NEW_TOKENS
    )


@pytest.fixture(scope="module")
def streaming_engine(kb_rag, knowledge_base):
    return AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=3, max_new_tokens=MAX_NEW_TOKENS, streaming=True
    )


class Recorder(BaseEventHandler):
    events: list = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event, **kwargs) -> None:
        self.events.append(event)


def test_query_returns_answer_used_sources_trace_and_usage(engine, kb_rag):
    response = engine.query(LOTHAIR_QUESTION)
    assert isinstance(response, Response) and response.response
    titles = [node.node.metadata["title"] for node in response.source_nodes]
    assert_used_prefix_of_retrieved(titles, retrieved_titles(kb_rag, LOTHAIR_QUESTION, 3))
    assert all(0 < node.score <= 1 for node in response.source_nodes)
    trace = response.metadata["adarag"]
    assert trace["stop_reason"] in ("confident", "exhausted", "static")
    assert trace["steps"][-1]["tiers"]
    assert trace["num_chunks_used"] == len(response.source_nodes)
    usage = trace["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= MAX_NEW_TOKENS
    assert usage["cached_tokens"] >= 0
    assert all(node.node_id in response.metadata for node in response.source_nodes)


def test_streaming_response_yields_tokens_incrementally(streaming_engine):
    response = streaming_engine.query(FILM_QUESTION)
    assert isinstance(response, StreamingResponse)
    assert response.source_nodes  # known before the first token
    assert response.metadata["adarag"]["usage"] is None
    tokens = list(response.response_gen)
    assert len(tokens) > 1
    assert response.metadata["adarag"]["usage"]["completion_tokens"] > 0


def test_async_streaming_and_concurrent_aqueries_do_not_block_the_loop(engine, streaming_engine):
    async def stream_tokens():
        response = await streaming_engine.aquery(FILM_QUESTION)
        assert isinstance(response, AsyncStreamingResponse) and response.source_nodes
        return [token async for token in response.async_response_gen()]

    tokens = asyncio.run(stream_tokens())
    assert len(tokens) > 1
    result = asyncio.run(probe(engine.aquery(LOTHAIR_QUESTION), engine.aquery(FILM_QUESTION)))
    assert all(response.response for response in result.results)
    assert result.overlapped and result.max_tick_gap_s < result.elapsed_s / 2


def test_instrumentation_events_and_token_counting_callbacks(kb_rag, knowledge_base):
    recorder = Recorder()
    root = instrument.get_dispatcher()
    root.add_event_handler(recorder)
    counter = TokenCountingHandler(tokenizer=kb_rag.tokenizer.encode)
    engine = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base,
        kb_rag,
        similarity_top_k=2,
        max_new_tokens=MAX_NEW_TOKENS,
        callback_manager=CallbackManager([counter]),
    )
    try:
        response = engine.query(LOTHAIR_QUESTION)
    finally:
        root.event_handlers.remove(recorder)
    names = [event.class_name() for event in recorder.events]
    for expected in (
        "QueryStartEvent",
        "RetrievalEndEvent",
        "SynthesizeStartEvent",
        "AdaptiveStepEvent",
        "AdaptiveStopEvent",
        "QueryEndEvent",
    ):
        assert expected in names
    stop = next(e for e in recorder.events if e.class_name() == "AdaptiveStopEvent")
    assert stop.node_ids == [node.node_id for node in response.source_nodes]
    usage = response.metadata["adarag"]["usage"]
    assert counter.prompt_llm_token_count == usage["prompt_tokens"]
    assert counter.completion_llm_token_count == usage["completion_tokens"]


class SpanRecorder(BaseSpanHandler[SimpleSpan]):
    """Names of the spans opened, and their parents."""

    spans: dict = Field(default_factory=dict)

    @classmethod
    def class_name(cls) -> str:
        return "SpanRecorder"

    def new_span(self, id_, bound_args, instance=None, parent_span_id=None, tags=None, **kwargs):
        self.spans[id_] = parent_span_id
        return SimpleSpan(id_=id_, parent_id=parent_span_id)

    def prepare_to_exit_span(self, id_, bound_args, instance=None, result=None, **kwargs):
        return None

    def prepare_to_drop_span(self, id_, bound_args, instance=None, err=None, **kwargs):
        return None


@contextmanager
def recording():
    """Events and spans the root dispatcher sees inside the block."""
    events, spans = Recorder(), SpanRecorder()
    root = instrument.get_dispatcher()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    try:
        yield events, spans
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)


def _llm_events(recorder):
    return [e for e in recorder.events if e.class_name().startswith("LLMChat")]


def _ancestors(spans, span_id):
    """``span_id`` and the spans it is nested in, innermost first."""
    chain = []
    while span_id is not None:
        chain.append(span_id)
        span_id = spans.spans.get(span_id)
    return chain


def _inside(spans, span_id, name):
    """Whether ``span_id`` is a span named ``name`` or nested in one."""
    return any(s.startswith(name + "-") for s in _ancestors(spans, span_id))


def test_generation_is_reported_as_llm_chat_events_inside_a_synthesize_span(engine, kb_rag):
    with recording() as (recorder, spans):
        response = engine.query(LOTHAIR_QUESTION)
    llm = _llm_events(recorder)
    assert [e.class_name() for e in llm] == ["LLMChatStartEvent", "LLMChatEndEvent"]
    start, end = llm
    assert start.messages[0].role.value == "system" and start.messages[-1].role.value == "user"
    used = response.source_nodes[0].node.get_content()
    assert used in start.messages[-1].content and LOTHAIR_QUESTION in start.messages[-1].content
    assert end.response.message.content == response.response
    assert end.response.raw["usage"] == response.metadata["adarag"]["usage"]
    assert start.model_dict["model_name"] == kb_rag.model_name != "default"
    name = "AdaptiveCachedQueryEngine.synthesize"
    synthesize = [span for span in spans.spans if span.startswith(name)]
    assert len(synthesize) == 1 and start.span_id == end.span_id
    assert synthesize[0] in _ancestors(spans, start.span_id)  # AdaRagLLM.chat, inside it
    assert spans.spans[synthesize[0]].startswith("AdaptiveCachedQueryEngine._query")


def test_streamed_generation_reports_each_delta_inside_the_synthesize_span(streaming_engine):
    """Regression: streamed in-progress and end events had span_id None."""
    with recording() as (recorder, spans):
        response = streaming_engine.query(FILM_QUESTION)
        deltas = list(response.response_gen)
    llm = _llm_events(recorder)
    progress = [e for e in llm if e.class_name() == "LLMChatInProgressEvent"]
    assert llm[0].class_name() == "LLMChatStartEvent" and llm[-1].class_name() == "LLMChatEndEvent"
    assert [e.response.delta for e in progress if e.response.delta] == deltas and len(deltas) > 1
    assert llm[-1].response.message.content == "".join(deltas)
    assert llm[-1].response.raw["usage"] == response.metadata["adarag"]["usage"]
    for event in llm:
        assert _inside(spans, event.span_id, "AdaptiveCachedQueryEngine.synthesize"), event


def test_async_streamed_generation_reports_its_events_inside_the_asynthesize_span(
    streaming_engine,
):
    async def stream():
        response = await streaming_engine.aquery(FILM_QUESTION)
        return [token async for token in response.async_response_gen()]

    with recording() as (recorder, spans):
        deltas = asyncio.run(stream())
    llm = _llm_events(recorder)
    assert len(deltas) > 1 and llm[-1].class_name() == "LLMChatEndEvent"
    assert llm[-1].response.raw["usage"]["completion_tokens"] > 0
    for event in llm:
        assert _inside(spans, event.span_id, "AdaptiveCachedQueryEngine.asynthesize"), event


def test_the_chat_engine_streams_async_deltas_as_they_are_decoded(engine, capsys):
    """Regression: async_response_gen yielded one '' after the whole answer."""
    chat = engine.as_chat_engine()

    async def first_delta_then_rest():
        response = await chat.astream_chat(LOTHAIR_QUESTION)
        deltas = []
        async for delta in response.async_response_gen():
            if not deltas:
                done_at_first = response.is_done
            deltas.append(delta)
        return response, deltas, done_at_first

    response, deltas, done_at_first = asyncio.run(first_delta_then_rest())
    assert len([d for d in deltas if d]) > 1 and not done_at_first
    assert response.source_nodes and response.response == "".join(deltas).strip()
    assert chat.chat_history[-1].content == response.response  # the turn is remembered

    async def printed():
        await (await chat.astream_chat("Where did she live?")).aprint_response_stream()

    capsys.readouterr()
    asyncio.run(printed())
    assert capsys.readouterr().out.strip() == chat.chat_history[-1].content != ""


def test_the_chat_engine_reports_its_turns_to_the_model(engine):
    chat = engine.as_chat_engine()
    chat.chat(LOTHAIR_QUESTION)
    with recording() as (recorder, _):
        second = chat.chat("Where did she live?")
    start, end = _llm_events(recorder)
    roles = [m.role.value for m in start.messages]
    assert roles == ["system", "user", "assistant", "user"]  # the earlier turn as chat turns
    assert start.messages[1].content.endswith(LOTHAIR_QUESTION)
    assert end.response.message.content == second.response


def test_warming_indexed_nodes_makes_their_first_query_a_cache_hit(kb_rag):
    tag = uuid.uuid4().hex[:8]  # texts no other test has cached
    documents = [
        Document(text=f"The {tag} lighthouse stands on Vell island, built in 1871."),
        Document(text=f"Vell island's {tag} ferry leaves every morning at seven."),
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=AdaRagEmbedding())
    engine = AdaptiveCachedQueryEngine.from_index(index, kb_rag, similarity_top_k=2)
    nodes = list(index.docstore.docs.values())
    assert engine.warm(nodes) == len(nodes) == 2
    assert engine.warm(nodes) == 0  # already cached
    response = engine.query(f"When was the {tag} lighthouse built?")
    tiers = [tier for step in response.metadata["adarag"]["steps"] for tier in step["tiers"]]
    assert tiers and "miss" not in tiers


def test_warming_a_chroma_backed_index_warms_its_nodes(kb_rag, caplog):
    """Regression: warm(index.docstore.docs.values()) warmed 0 nodes, silently, over Chroma."""
    tag = uuid.uuid4().hex[:8]
    client = chromadb.EphemeralClient()
    collection = client.create_collection(f"warm-{tag}")
    storage = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    documents = [
        Document(text=f"The {tag} observatory sits on Mount Orrin, opened in 1903."),
        Document(text=f"Mount Orrin's {tag} railway climbs it twice a day."),
    ]
    index = VectorStoreIndex.from_documents(
        documents, storage_context=storage, embed_model=AdaRagEmbedding()
    )
    engine = AdaptiveCachedQueryEngine.from_index(index, kb_rag, similarity_top_k=2)
    with caplog.at_level("WARNING"):
        assert engine.warm(index.docstore.docs.values()) == 0  # empty with a vector store
    assert "engine.warm_index(index)" in caplog.text
    assert engine.warm_index(index) == 2
    assert engine.warm_index(index) == 0  # already cached
    response = engine.query(f"When did the {tag} observatory open?")
    tiers = [tier for step in response.metadata["adarag"]["steps"] for tier in step["tiers"]]
    assert tiers and "miss" not in tiers
    client.delete_collection(collection.name)


def test_from_vector_store_index_over_the_adarag_collection(kb_rag, knowledge_base):
    store = ChromaVectorStore(chroma_collection=knowledge_base.collection)
    index = VectorStoreIndex.from_vector_store(store, embed_model=AdaRagEmbedding())
    engine = AdaptiveCachedQueryEngine.from_index(
        index, kb_rag, similarity_top_k=2, max_new_tokens=MAX_NEW_TOKENS
    )
    response = engine.query(FILM_QUESTION)
    assert response.response
    assert {"Aas Ka Panchhi", "Phoolwari"} & {
        n.node.metadata.get("title") for n in response.source_nodes
    }


def test_from_chroma_collection_written_by_llama_index(kb_rag):
    client = chromadb.EphemeralClient()
    collection = client.create_collection(f"li-{uuid.uuid4().hex[:8]}")
    documents = [
        Document(text="The Zorblat river flows through the town of Quenby.", doc_id="river"),
        Document(text="Quenby is famous for its glass bells.", doc_id="bells"),
    ]
    storage = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    VectorStoreIndex.from_documents(
        documents, storage_context=storage, embed_model=AdaRagEmbedding()
    )
    engine = AdaptiveCachedQueryEngine.from_chroma_collection(
        collection, kb_rag, similarity_top_k=1, max_new_tokens=MAX_NEW_TOKENS
    )
    response = engine.query("Which river flows through Quenby?")
    assert len(response.source_nodes) == 1
    assert "Zorblat" in response.source_nodes[0].node.get_content()
    assert "_node_content" not in response.source_nodes[0].node.metadata
    # a metadata filter keeps retrieval to the matching document, however similar the other
    bells_only = AdaptiveCachedQueryEngine.from_chroma_collection(
        collection,
        kb_rag,
        similarity_top_k=1,
        max_new_tokens=MAX_NEW_TOKENS,
        where={"document_id": "bells"},
    )
    nodes = bells_only.retrieve(QueryBundle("Which river flows through Quenby?"))
    assert [n.node.get_content() for n in nodes] == ["Quenby is famous for its glass bells."]
    client.delete_collection(collection.name)


def test_from_chroma_collection_with_the_collections_chroma_embedding_function(kb_rag):
    function = _WordFunction()
    client = chromadb.EphemeralClient()
    collection = client.create_collection(f"fn-{uuid.uuid4().hex[:8]}", embedding_function=function)
    collection.add(
        ids=["river", "bells"],
        documents=["The Zorblat river flows through Quenby.", "Quenby rings its glass bells."],
    )
    engine = AdaptiveCachedQueryEngine.from_chroma_collection(
        collection, kb_rag, similarity_top_k=1, embedding_function=function
    )
    nodes = engine.retrieve(QueryBundle("which river flows there"))
    assert [n.node.node_id for n in nodes] == ["river"] and 0 < nodes[0].score <= 1
    with pytest.raises(ConfigError, match="embedding_model .* or embedding_function, not both"):
        AdaptiveCachedQueryEngine.from_chroma_collection(
            collection, kb_rag, embedding_model="/some/model", embedding_function=function
        )
    client.delete_collection(collection.name)


class _WordFunction(chromadb.EmbeddingFunction):
    """A chromadb embedding function: bag-of-words counts over 32 hashed buckets."""

    def __init__(self):
        pass

    def __call__(self, input):
        vectors = []
        for text in input:
            vector = [0.0] * 32
            for word in text.lower().replace(".", "").split():
                vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % 32] += 1.0
            vectors.append(vector)
        return vectors

    @staticmethod
    def name():
        return "word-buckets-32"


def test_prompt_templates_are_exposed_and_updated(kb_rag, knowledge_base):
    engine = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=2, max_new_tokens=MAX_NEW_TOKENS
    )
    prompts = engine.get_prompts()
    assert set(prompts) == {"text_qa_template"}
    assert "{context_str}" in prompts["text_qa_template"].get_template()
    template = PromptTemplate("Facts:\n{context_str}\nOne-line answer. Q: {query_str}")
    engine.update_prompts({"text_qa_template": template})
    assert engine.rag.config.prompt.context_intro == "Facts:\n"
    assert engine.rag.config.prompt.question_template == "\nOne-line answer. Q: {question}"
    assert engine.get_prompts()["text_qa_template"].get_template() == template.get_template()
    assert engine.query(LOTHAIR_QUESTION).response
    with pytest.raises(ConfigError, match="context_str"):
        engine.update_prompts({"text_qa_template": PromptTemplate("Q: {query_str}")})
    # the key LlamaIndex's guides use for query engines updates the same template
    terse = PromptTemplate("Notes:\n{context_str}\nShort answer. Q: {query_str}")
    engine.update_prompts({"response_synthesizer:text_qa_template": terse})
    assert engine.rag.config.prompt.context_intro == "Notes:\n"
    assert set(engine.get_prompts()) == {"text_qa_template"}
    # a refine template would never be used: refused, the QA template kept
    with pytest.raises(ConfigError, match=r"\['refine_template'\] would not be used"):
        engine.update_prompts({"refine_template": terse})
    assert engine.get_prompts()["text_qa_template"].get_template() == terse.get_template()


def test_unrelated_question_gets_no_context_and_no_sources(engine):
    response = engine.query(UNRELATED_QUESTION)
    assert response.response == NO_CONTEXT_ANSWER and response.source_nodes == []
    assert response.metadata["adarag"]["stop_reason"] == "no_context"


def test_llm_completes_chats_and_streams_with_usage(kb_rag):
    llm = AdaRagLLM(rag=kb_rag, max_new_tokens=8)
    completion = llm.complete("Name a primary colour.")
    assert completion.text and completion.raw["usage"]["completion_tokens"] > 0
    chat = llm.chat([ChatMessage(role="user", content="Say hello.")])
    assert chat.message.content and chat.raw["usage"]["prompt_tokens"] > 0
    deltas = [part.delta for part in llm.stream_complete("Count: one, two,")]
    assert len([d for d in deltas if d]) > 1
    assert llm.metadata.is_chat_model and llm.metadata.context_window > 0
    assert llm.metadata.model_name == kb_rag.engine.checkpoint.name  # not "default"

    async def run_async():
        answer = await llm.acomplete("Name a fruit.")
        parts = [part.delta async for part in await llm.astream_chat([ChatMessage(content="Hi")])]
        return answer, parts

    answer, parts = asyncio.run(run_async())
    assert answer.text and len([p for p in parts if p]) > 1


def test_llm_honours_per_call_max_tokens_and_stop(kb_rag):
    llm = AdaRagLLM(rag=kb_rag, max_new_tokens=24)
    short = llm.complete("Count from one to twenty: one, two,", max_tokens=2)
    assert short.raw["usage"]["completion_tokens"] <= 2
    long = llm.complete("Count from one to twenty: one, two,")
    assert long.raw["usage"]["completion_tokens"] > 2
    word = long.text.split()[1] if len(long.text.split()) > 1 else long.text.split()[0]
    stopped = llm.complete("Count from one to twenty: one, two,", stop=[word])
    assert word not in stopped.text and len(stopped.text) < len(long.text)


def test_node_postprocessors_choose_the_candidate_chunks(kb_rag, knowledge_base):
    class KeepLast(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):
            return nodes[-1:]

    plain = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=3, max_new_tokens=2
    )
    engine = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base,
        kb_rag,
        similarity_top_k=3,
        max_new_tokens=2,
        node_postprocessors=[KeepLast()],
    )
    retrieved = plain.retrieve(QueryBundle(LOTHAIR_QUESTION))
    response = engine.query(LOTHAIR_QUESTION)
    assert len(retrieved) == 3
    assert [n.node_id for n in response.source_nodes] == [retrieved[-1].node_id]
    cutoff = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=2)]
    )
    assert not cutoff.query(LOTHAIR_QUESTION).source_nodes  # nothing passes: no context


def test_synthesis_options_other_than_one_pass_are_refused(kb_rag, knowledge_base):
    def build(**kwargs):
        return AdaptiveCachedQueryEngine.from_knowledge_base(knowledge_base, kb_rag, **kwargs)

    assert build(response_mode="compact").retrieve(QueryBundle(LOTHAIR_QUESTION))
    with pytest.raises(ConfigError, match="response_mode 'refine' is not supported"):
        build(response_mode="refine")
    with pytest.raises(ConfigError, match="response_synthesizer is not supported"):
        build(response_synthesizer=object())


def test_the_engine_serves_as_a_query_engine_tool(engine):
    tool = QueryEngineTool.from_defaults(engine, name="wiki", description="Answers from a wiki.")
    output = tool.call(LOTHAIR_QUESTION)
    assert output.content == output.raw_output.response and output.raw_output.source_nodes
    assert tool.metadata.name == "wiki"


def test_drops_into_a_condense_question_chat_engine(kb_rag, streaming_engine):
    llm = AdaRagLLM(rag=kb_rag, max_new_tokens=16)
    chat = CondenseQuestionChatEngine.from_defaults(query_engine=streaming_engine, llm=llm)

    async def first_turn():
        response = await chat.astream_chat("Who was the mother of Lothair II?")
        return [token async for token in response.async_response_gen()]

    assert len(asyncio.run(first_turn())) > 1
    second = chat.stream_chat("When did she die?")
    assert "".join(second.response_gen) and second.source_nodes


def test_the_adaptive_chat_engine_carries_earlier_turns(engine, kb_rag):
    chat = engine.as_chat_engine()
    first = chat.chat(LOTHAIR_QUESTION)
    second = chat.chat("Where did she live?")
    assert first.response and second.response and len(chat.chat_history) == 4
    # the follow-up is retrieved with the first question, so it finds the same passages
    assert {n.node_id for n in second.source_nodes} & {n.node_id for n in first.source_nodes}
    streamed = chat.stream_chat("And her husband?")
    deltas = list(streamed.response_gen)
    assert len(deltas) > 1 and streamed.source_nodes
    assert [m.role.value for m in chat.chat_history] == ["user", "assistant"] * 3
    assert chat.chat_history[-1].content == "".join(deltas).strip()
    chat.reset()
    assert chat.chat_history == []
    # a follow-up is retrieved with the earlier answers too, so the unrelated question is asked
    # in a fresh conversation: answered without context, it is not carried
    unrelated = chat.chat(UNRELATED_QUESTION)
    assert not unrelated.source_nodes and chat._turns() == []
