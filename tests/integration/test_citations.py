"""Citation mode through LlamaIndex and LangChain, with the real model and knowledge base."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.packs.adarag")
pytest.importorskip("langchain_adarag")

from langchain_adarag import AdaptiveCachedRAG  # noqa: E402
from llama_index.core.base.response.schema import Response  # noqa: E402
from llama_index.packs.adarag import AdaptiveCachedQueryEngine  # noqa: E402

from adarag.pipeline import CITATION_KEY, cited_numbers  # noqa: E402
from tests.integration.conftest import FILM_QUESTION, LOTHAIR_QUESTION  # noqa: E402

pytestmark = pytest.mark.integration


def _assert_numbered(numbers: list[int], answer: str) -> None:
    assert numbers == list(range(1, len(numbers) + 1)) and numbers
    assert set(cited_numbers(answer)) <= set(numbers)  # a cited number names a source given


def test_the_llama_index_engine_numbers_its_sources_and_reuses_chunk_kv(kb_rag, knowledge_base):
    kb_rag.warm(knowledge_base.chunks())  # KV of the unnumbered chunk texts
    engine = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=3, max_new_tokens=24, citation_mode=True
    )
    response = engine.query(LOTHAIR_QUESTION)
    assert isinstance(response, Response)
    numbers = [node.metadata[CITATION_KEY] for node in response.source_nodes]
    _assert_numbered(numbers, response.response)
    for step in response.metadata["adarag"]["steps"]:
        assert "miss" not in step["tiers"]  # the numbers did not change the chunks' cache keys
    texts = [node.node.get_content() for node in response.source_nodes]
    context = engine.rag.prompts.messages(LOTHAIR_QUESTION, texts)[1]["content"]
    assert all(f"[{idx + 1}] {text}" in context for idx, text in enumerate(texts))
    plain = AdaptiveCachedQueryEngine.from_knowledge_base(
        knowledge_base, kb_rag, similarity_top_k=3
    )
    assert not plain.rag.config.prompt.citations  # the shared pipeline is left as it was


def test_the_langchain_runnable_numbers_its_context_documents(kb_rag):
    chain = AdaptiveCachedRAG(rag=kb_rag, k=3, max_new_tokens=24, citations=True)
    out = chain.invoke(FILM_QUESTION)
    numbers = [doc.metadata[CITATION_KEY] for doc in out["context"]]
    _assert_numbered(numbers, out["answer"])
    rebuilt = chain.with_config(configurable={})  # a rebuild keeps the citation pipeline
    assert rebuilt.invoke(FILM_QUESTION)["context"][0].metadata[CITATION_KEY] == 1
