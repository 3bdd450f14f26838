"""AdaptiveCachedRAG, its retriever and ChatAdaRag against real LangChain objects."""

from __future__ import annotations

import asyncio
import uuid
import warnings

import pytest

pytest.importorskip("langchain_adarag")

from langchain_adarag import (  # noqa: E402
    AdaptiveCachedRAG,
    AdaptiveCachedRetriever,
    AdaRagEmbeddings,
    ChatAdaRag,
)
from langchain_core._api import LangChainDeprecationWarning  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler, UsageMetadataCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    HumanMessage,
    SystemMessage,
    trim_messages,
)
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate  # noqa: E402
from langchain_core.runnables import (
    ConfigurableField,
    RunnableBranch,
    RunnableLambda,  # noqa: E402
    RunnablePassthrough,  # noqa: E402
)
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402
from langchain_tests.integration_tests import (  # noqa: E402
    ChatModelIntegrationTests,
    RetrieversIntegrationTests,
)

from adarag import ConfigError, InputError  # noqa: E402
from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER  # noqa: E402
from adarag.retrievers import SentenceEmbedder  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    FILM_QUESTION,
    LOTHAIR_QUESTION,
    UNRELATED_QUESTION,
    assert_used_prefix_of_retrieved,
    retrieved_titles,
)
from tests.integration.loop_probe import probe  # noqa: E402

pytestmark = pytest.mark.integration
KEYS = {"input", "context", "answer", "confidence", "stop_reason", "usage_metadata"}


@pytest.fixture(scope="module")
def chain(kb_rag):
    return AdaptiveCachedRAG(rag=kb_rag, k=3, max_new_tokens=12)


def test_invoke_returns_the_retrieval_chain_keys(chain):
    out = chain.invoke(LOTHAIR_QUESTION)
    assert set(out) == KEYS and out["input"] == LOTHAIR_QUESTION and out["answer"]
    titles = [doc.metadata["title"] for doc in out["context"]]
    assert_used_prefix_of_retrieved(titles, retrieved_titles(chain.rag, LOTHAIR_QUESTION, 3))
    assert all(0 < doc.metadata["score"] <= 1 and doc.id for doc in out["context"])
    assert out["stop_reason"] in ("confident", "exhausted", "static")  # the stop rule's reason
    usage = out["usage_metadata"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 12
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert "cache_read" in usage["input_token_details"]


def test_stream_sends_context_first_then_answer_deltas(chain):
    chunks = list(chain.stream({"input": FILM_QUESTION, "k": 2}))
    assert 1 <= len(chunks[0]["context"]) <= 2  # the chunks adaptive augmentation kept
    deltas = [chunk["answer"] for chunk in chunks[1:] if chunk.get("answer")]
    assert len(deltas) > 1
    assert "usage_metadata" in chunks[-1]


def test_astream_events_show_retriever_custom_steps_and_stream(chain):
    async def collect():
        return [event async for event in chain.astream_events(FILM_QUESTION, version="v2")]

    events = asyncio.run(collect())
    kinds = {event["event"] for event in events}
    assert {"on_chain_start", "on_retriever_end", "on_custom_event", "on_chain_stream"} <= kinds
    step = next(event for event in events if event["event"] == "on_custom_event")
    assert step["name"] == "adarag_step" and step["data"]["tiers"]
    streamed = [e for e in events if e["event"] == "on_chain_stream" and e["name"] == "adarag"]
    assert len([e for e in streamed if e["data"]["chunk"].get("answer")]) > 1


def test_generation_is_a_chat_model_run_with_streamed_tokens_and_usage(chain):
    async def collect():
        return [event async for event in chain.astream_events(FILM_QUESTION, version="v2")]

    events = asyncio.run(collect())
    model_events = [e for e in events if e["name"] == "ChatAdaRag"]
    kinds = [e["event"] for e in model_events]
    assert kinds[0] == "on_chat_model_start" and kinds[-1] == "on_chat_model_end"
    streamed = [e["data"]["chunk"].content for e in model_events if e["event"] == kinds[1]]
    assert kinds[1] == "on_chat_model_stream" and len(streamed) > 1
    chain_run = next(e["run_id"] for e in events if e["event"] == "on_chain_start")
    assert model_events[0]["parent_ids"][-1] == chain_run  # a child of the chain's run
    messages = model_events[0]["data"]["input"]["messages"][0]
    assert messages[0].type == "system" and FILM_QUESTION in messages[-1].content
    final = model_events[-1]["data"]["output"]
    answer = next(e for e in events if e["event"] == "on_chain_end" and e["name"] == "adarag")
    assert final.content == "".join(streamed) == answer["data"]["output"]["answer"]
    assert final.usage_metadata == answer["data"]["output"]["usage_metadata"]


def test_usage_handler_counts_the_generation(chain):
    handler = UsageMetadataCallbackHandler()
    out = chain.invoke(LOTHAIR_QUESTION, config={"callbacks": [handler]})
    (name,) = handler.usage_metadata  # one model: the pipeline's, by its checkpoint's name
    assert name == chain.rag.engine.checkpoint.name != "default"
    usage = handler.usage_metadata[name]
    assert usage["input_tokens"] == out["usage_metadata"]["input_tokens"] > 0
    assert usage["output_tokens"] == out["usage_metadata"]["output_tokens"] > 0


def test_the_chat_model_names_its_checkpoint_in_metadata_usage_and_traces(kb_rag):
    """Regression: the model was named "default" (the config value)."""
    model = ChatAdaRag(rag=kb_rag, max_tokens=4)
    handler = UsageMetadataCallbackHandler()
    reply = model.invoke("Say hi.", config={"callbacks": [handler]})
    name = kb_rag.engine.checkpoint.name
    assert reply.response_metadata["model_name"] == name != "default"
    assert list(handler.usage_metadata) == [name]
    assert model._get_ls_params()["ls_model_name"] == name


def test_the_chat_model_counts_tokens_with_its_own_tokenizer(kb_rag):
    """Regression: counting fell back to GPT-2's tokenizer, unavailable offline, and gave 0."""
    model = ChatAdaRag(rag=kb_rag, max_tokens=4)
    text = "Ermengarde of Tours was the mother of Lothair II."
    expected = len(kb_rag.tokenizer.encode(text, add_special_tokens=False))
    assert model.get_num_tokens(text) == expected > 0
    messages = [SystemMessage("Answer briefly."), HumanMessage("Name a prime number.")]
    reply = model.invoke(messages)
    # the prompt is the messages and the assistant header, a few tokens the same for any prompt
    header = reply.usage_metadata["input_tokens"] - model.get_num_tokens_from_messages(messages)
    other = [SystemMessage("Be terse."), HumanMessage("Name a colour, please.")]
    other_reply = model.invoke(other)
    assert (
        0
        < header
        == other_reply.usage_metadata["input_tokens"] - (model.get_num_tokens_from_messages(other))
    )


def test_token_counts_add_up_so_trim_messages_keeps_the_question(kb_rag):
    """Regression: [human] counted 36 tokens and [system, human] 22 (SmolLM2's chat template
    inserted its default system prompt into a list without one), so trim_messages kept only the
    system message; then each list's count held the assistant header once, so [system] 11 and
    [human] 15 made more than [system, human] 22, and with max_tokens 24 trim_messages still
    kept only the system message."""
    model = ChatAdaRag(rag=kb_rag, max_tokens=4)
    system = SystemMessage("Answer in one short sentence.")
    question = HumanMessage("What is the capital of France?")
    count = model.get_num_tokens_from_messages
    earlier = [HumanMessage("Name a river in Paris."), AIMessage("The Seine.")]
    assert 0 < count([question]) < count([system, question]) == count([system]) + count([question])
    assert count([system, *earlier, question]) == count([system, *earlier]) + count([question])
    budget = count([system, question]) + 2
    kept = trim_messages(
        [system, question],
        token_counter=model,
        max_tokens=budget,
        strategy="last",
        include_system=True,
    )
    assert kept == [system, question]
    long_history = [HumanMessage("Tell me about Paris. " * 6), AIMessage("Paris is large. " * 6)]
    messages = [system, *long_history, *earlier, question]
    kept = trim_messages(messages, token_counter=model, max_tokens=60, include_system=True)
    assert kept[0] == system and kept[-1] == question and long_history[0] not in kept
    assert count(kept) <= 60 < count(messages)


def test_an_output_parser_takes_the_answer_alone(chain):
    """Regression: ``chain | StrOutputParser()`` failed with pydantic's ValidationError on the
    output dict, with no hint."""
    with pytest.raises(ConfigError, match=r"returns a dict .* chain\.answer_only\(\) \| StrOut"):
        chain | StrOutputParser()
    text = (chain.answer_only() | StrOutputParser()).invoke(LOTHAIR_QUESTION)
    assert isinstance(text, str) and text
    prompt = PromptTemplate.from_template("{question}")
    deltas = list((prompt | chain.answer_only() | StrOutputParser()).stream(LOTHAIR_QUESTION))
    assert all(isinstance(d, str) for d in deltas) and "".join(deltas) == text


def test_the_textbook_chain_reuses_the_documents_kv(kb_rag):
    """Regression: ``{context: retriever | format_docs, question} | prompt | ChatAdaRag |
    StrOutputParser`` answered with ``cache_read: 0``: the documents in the prompt were
    prefilled as plain text."""
    tag = uuid.uuid4().hex[:8]
    documents = [Document(f"The {tag} river flows through Quenby."), Document("Quenby bells.")]
    store = InMemoryVectorStore(AdaRagEmbeddings())
    store.add_documents(documents)
    retriever = store.as_retriever(search_kwargs={"k": 2})
    AdaptiveCachedRAG(rag=kb_rag).warm(documents)

    def format_docs(docs):
        return "\n\n".join(doc.page_content for doc in docs)

    prompt = ChatPromptTemplate.from_template(
        "Answer the question based only on the following context:\n{context}\n\n"
        "Question: {question}\n"
    )
    model = ChatAdaRag(rag=kb_rag, max_tokens=8)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt
    question = f"Which river flows through Quenby ({tag})?"
    reply = (chain | model).invoke(question)
    assert reply.usage_metadata["input_token_details"]["cache_read"] > 0
    assert isinstance((chain | model | StrOutputParser()).invoke(question), str)
    chunks = list((chain | model).stream(question))
    assert chunks[-1].usage_metadata["input_token_details"]["cache_read"] > 0

    # documents in the system message are prefilled as plain text (the README says so)
    in_system = ChatPromptTemplate.from_messages(
        [("system", "Context:\n{context}"), ("human", "{question}")]
    )
    inputs = {"context": retriever | format_docs, "question": RunnablePassthrough()}
    reply = (inputs | in_system | model).invoke(question)
    assert reply.usage_metadata["input_token_details"]["cache_read"] == 0


def test_tools_and_structured_output_are_refused_saying_why(kb_rag):
    model = ChatAdaRag(rag=kb_rag)

    def lookup(city: str) -> str:
        """The weather in ``city``."""
        return "sunny"

    with pytest.raises(NotImplementedError, match="does not support tool calling: adarag"):
        model.bind_tools([lookup])
    with pytest.raises(NotImplementedError, match="no constrained \\(JSON schema\\) decoding"):
        model.with_structured_output({"title": "City", "type": "object", "properties": {}})


def test_a_stream_closed_early_ends_its_chat_model_run_with_an_error(chain):
    runs = RunRecorder()
    stream = chain.stream(FILM_QUESTION, config={"callbacks": [runs]})
    next(stream)  # the context
    next(stream)  # one answer delta
    stream.close()
    assert runs.started == 1 and runs.errors == 1 and runs.ended == 0


class RunRecorder(BaseCallbackHandler):
    """Counts chat-model runs started, ended and failed; keeps the messages they were given."""

    def __init__(self) -> None:
        self.started = self.ended = self.errors = 0
        self.messages = []

    def on_chat_model_start(self, serialized, messages, **kwargs):
        self.started += 1
        self.messages.append(messages[0])

    def on_llm_end(self, response, **kwargs):
        self.ended += 1

    def on_llm_error(self, error, **kwargs):
        self.errors += 1


def test_prompt_values_and_the_question_key_are_inputs(chain):
    assert (
        chain.invoke({"question": LOTHAIR_QUESTION}, max_new_tokens=2)["input"] == LOTHAIR_QUESTION
    )
    text_prompt = PromptTemplate.from_template("{q}")
    out = (text_prompt | chain).invoke({"q": LOTHAIR_QUESTION}, max_new_tokens=2)
    assert out["input"] == LOTHAIR_QUESTION
    # a chat prompt's last human message is the question, its earlier turns the history
    chat_prompt = ChatPromptTemplate.from_messages(
        [("human", LOTHAIR_QUESTION), ("ai", "Marta Kowalski."), ("human", "{q}")]
    )
    runs = RunRecorder()
    out = (chat_prompt | chain).invoke({"q": "Where did she live?"}, {"callbacks": [runs]})
    assert out["input"] == "Where did she live?"
    (messages,) = runs.messages
    assert [m.type for m in messages] == ["system", "human", "ai", "human"]
    assert messages[2].content == "Marta Kowalski."
    with pytest.raises(InputError, match="must end with a human message"):
        (ChatPromptTemplate.from_messages([("ai", "{q}")]) | chain).invoke({"q": "x"})


def test_bind_sets_call_options_and_names_the_ones_it_takes(chain):
    out = chain.bind(max_new_tokens=2).invoke(FILM_QUESTION)
    assert 0 < out["usage_metadata"]["output_tokens"] <= 2
    with pytest.raises(InputError, match=r"unknown call option\(s\) \['max_tokens'\]"):
        chain.bind(max_tokens=2).invoke(FILM_QUESTION)


def test_configured_fields_keep_the_pipeline_and_the_retriever(kb_rag):
    store = InMemoryVectorStore(AdaRagEmbeddings())
    store.add_texts(["The Zorblat river flows through Quenby."], metadatas=[{"source": "river"}])
    chain = AdaptiveCachedRAG(rag=kb_rag, retriever=store.as_retriever(search_kwargs={"k": 1}))
    configurable = chain.configurable_fields(max_new_tokens=ConfigurableField(id="answer_tokens"))
    config = {"configurable": {"answer_tokens": 2}}
    rebuilt, _ = configurable._prepare(config)
    assert rebuilt.rag is kb_rag and rebuilt.max_new_tokens == 2  # no second model loaded
    out = configurable.invoke("Which river flows through Quenby?", config)
    assert [doc.metadata["source"] for doc in out["context"]] == ["river"]
    assert 0 < out["usage_metadata"]["output_tokens"] <= 2


def test_output_schema_names_the_output_keys(chain):
    schema = chain.get_output_jsonschema()
    assert set(schema["properties"]) == KEYS and "answer" in schema["required"]


def test_embeddings_are_the_knowledge_base_embedder(kb_rag):
    text = "Quenby is famous for glass bells."
    assert AdaRagEmbeddings().embed_query(text) == SentenceEmbedder().embed_query(text)
    assert len(AdaRagEmbeddings().embed_documents([text, "x"])) == 2


def test_concurrent_ainvokes_do_not_block_the_event_loop(chain):
    result = asyncio.run(probe(chain.ainvoke(LOTHAIR_QUESTION), chain.ainvoke(FILM_QUESTION)))
    assert all(out["answer"] for out in result.results)
    assert result.overlapped and result.max_tick_gap_s < result.elapsed_s / 2


def test_batch_and_pick(chain):
    answers = chain.pick("answer").batch([LOTHAIR_QUESTION, FILM_QUESTION])
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)


def test_any_langchain_retriever_supplies_the_context(kb_rag, corpus_path):
    store = InMemoryVectorStore(AdaRagEmbeddings())
    store.add_texts(
        ["The Zorblat river flows through Quenby.", "Quenby is famous for glass bells."],
        metadatas=[{"source": "river"}, {"source": "bells"}],
    )
    chain = AdaptiveCachedRAG(rag=kb_rag, retriever=store.as_retriever(search_kwargs={"k": 1}))
    out = chain.invoke("Which river flows through Quenby?")
    assert [doc.metadata["source"] for doc in out["context"]] == ["river"]
    assert out["answer"]


def test_a_history_aware_runnable_retriever_gets_the_conversation(kb_rag):
    # what create_history_aware_retriever builds: the question alone without history, else a
    # condensed query (here: the earlier questions and this one) sent to a retriever
    store = InMemoryVectorStore(AdaRagEmbeddings())
    store.add_texts(
        ["The Zorblat river flows through Quenby.", "Quenby is famous for glass bells."],
        metadatas=[{"source": "river"}, {"source": "bells"}],
    )
    retriever = store.as_retriever(search_kwargs={"k": 1})
    seen = []

    def condense(inputs):
        seen.append(inputs)
        asked = [m.content for m in inputs["chat_history"] if m.type == "human"]
        return " ".join([*asked, inputs["input"]])

    history_aware = RunnableBranch(
        (lambda x: not x.get("chat_history"), (lambda x: x["input"]) | retriever),
        RunnableLambda(condense) | retriever,
    )
    chain = AdaptiveCachedRAG(rag=kb_rag, retriever=history_aware, max_new_tokens=4)
    first = chain.invoke("Which river flows through Quenby?")
    assert [doc.metadata["source"] for doc in first["context"]] == ["river"] and not seen
    history = [("human", "What is Quenby famous for?"), ("ai", first["answer"])]
    out = chain.invoke({"input": "Tell me more about it.", "chat_history": history})
    (inputs,) = seen
    assert [m.type for m in inputs["chat_history"]] == ["human", "ai"]
    assert [doc.metadata["source"] for doc in out["context"]] == ["bells"]
    assert chain.as_retriever().invoke("Which river flows through Quenby?")


def test_warming_vector_store_documents_caches_their_kv(kb_rag):
    tag = uuid.uuid4().hex[:8]  # texts no other test has cached
    documents = [Document(f"The {tag} mill grinds rye for Oster."), Document(f"Oster {tag} fair.")]
    chain = AdaptiveCachedRAG(rag=kb_rag)
    ids = [kb_rag.prompts.chunk_ids(doc.page_content) for doc in documents]
    assert not any(kb_rag.cache.has_independent(i) for i in ids)
    assert chain.warm(documents) == 2 and chain.warm(documents) == 0
    assert all(kb_rag.cache.has_independent(i) for i in ids)


def test_unrelated_question_gets_no_context(chain):
    out = chain.invoke(UNRELATED_QUESTION)
    assert out["answer"] == NO_CONTEXT_ANSWER and out["context"] == []
    assert out["stop_reason"] == "no_context"


def test_retriever_and_chat_model_compose_in_lcel(chain):
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the context.\n{context}"), ("human", "{question}")]
    )
    retriever = chain.as_retriever(k=2)
    docs = retriever.invoke(LOTHAIR_QUESTION)
    titles = [doc.metadata["title"] for doc in docs]
    assert_used_prefix_of_retrieved(titles, retrieved_titles(chain.rag, LOTHAIR_QUESTION, 2))
    lcel = (
        {
            "context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | chain.as_chat_model().bind(max_tokens=8)
    )
    message = lcel.invoke(LOTHAIR_QUESTION)
    assert message.content and message.usage_metadata["output_tokens"] > 0


class TestChatAdaRagStandard(ChatModelIntegrationTests):
    """langchain-tests' standard chat-model suite, on the real model."""

    @pytest.fixture(autouse=True)
    def _shared(self, kb_rag):
        self.rag = kb_rag

    @property
    def chat_model_class(self):
        return ChatAdaRag

    @property
    def chat_model_params(self):
        return {"rag": self.rag, "max_tokens": 12}

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supported_usage_metadata_details(self):
        return {"invoke": [], "stream": []}


class TestAdaptiveCachedRetrieverStandard(RetrieversIntegrationTests):
    """langchain-tests' standard retriever suite, over the knowledge base.

    The suite expects exactly k documents; with adaptive augmentation the retriever returns the
    (possibly shorter) prefix the model was confident with, so the suite runs on a static pipeline.
    """

    @pytest.fixture(autouse=True)
    def _shared(self, kb_rag):
        self.rag = kb_rag.with_config(augment={"enabled": False})

    @property
    def retriever_constructor(self):
        return AdaptiveCachedRetriever

    @property
    def retriever_constructor_params(self):
        return {"rag": self.rag, "k": 3}

    @property
    def retriever_query_example(self) -> str:
        return LOTHAIR_QUESTION


def test_a_message_list_conversation_carries_its_earlier_turns(chain):
    """The README's conversation recipe, with no deprecated LangChain class."""
    history: list = []
    outputs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", LangChainDeprecationWarning)
        for question in (LOTHAIR_QUESTION, "Where did she live?", "And her husband?"):
            out = chain.invoke({"input": question, "chat_history": history})
            history += [HumanMessage(question), AIMessage(out["answer"])]
            outputs.append(out)
    first, second, third = outputs
    assert len(history) == 6 and first["answer"] and third["answer"]
    # the follow-up is retrieved with the first turn, and the first turn is in its prompt
    assert {d.id for d in second["context"]} & {d.id for d in first["context"]}
    with_turn = second["usage_metadata"]["input_tokens"]
    same_chunks = chain.rag.query(
        "Where did she live?", chunks=[d.page_content for d in second["context"]]
    )
    assert with_turn > same_chunks.trace.num_prompt_tokens


def test_chat_history_must_be_messages(chain):
    from adarag import InputError

    with pytest.raises(InputError, match="chat_history"):
        chain.invoke({"input": LOTHAIR_QUESTION, "chat_history": "not a list"})
