"""``adarag serve`` with the real model and embedding model: documents added, asked about and
deleted through OpenAI's client, ``/v1/embeddings`` through LangChain's ``OpenAIEmbeddings``,
and ``/metrics`` after ten requests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from adarag.retrievers import KnowledgeBase
from tests.documents import DOCX_FACT, PDF_FACT, pdf_bytes
from tests.documents_server import markdown_knowledge_server
from tests.reliability.http_server import Served

pytestmark = pytest.mark.integration
pytest.importorskip("pypdf")
pytest.importorskip("prometheus_client")
API_KEY = "documents-key"


@pytest.fixture(scope="module")
def knowledge(shared_rag, tmp_path_factory) -> Iterator[tuple[Served, KnowledgeBase]]:
    """A server over a knowledge base of its own holding one markdown file."""
    root = tmp_path_factory.mktemp("documents-http")
    with markdown_knowledge_server(shared_rag, root, "documents", API_KEY) as found:
        yield found


def client_of(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=300)


def processed(client: openai.OpenAI, file_id: str):
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = client.files.retrieve(file_id)
        if found.status != "uploaded":
            assert found.status == "processed", found
            return found
        time.sleep(0.5)
    raise AssertionError(f"{file_id} was not processed in time")


def ask(client: openai.OpenAI, question: str) -> tuple[str, list[str]]:
    response = client.chat.completions.create(
        model="adarag", messages=[{"role": "user", "content": question}], max_tokens=16
    )
    sources = [s["metadata"]["source"] for s in response.model_extra["adarag"]["sources"]]
    return response.choices[0].message.content, sources


def test_a_file_sent_with_the_openai_client_is_answered_from(knowledge):
    served, _ = knowledge
    client = client_of(served)
    pdf = pdf_bytes([["Gate manual"], ["Access", PDF_FACT, "Change it every spring."]])
    sent = client.files.create(file=("gate-manual.pdf", pdf), purpose="assistants")
    assert sent.filename == "gate-manual.pdf" and sent.bytes == len(pdf)
    done = processed(client, sent.id)
    assert done.model_extra["adarag"] == {"state": "ready", "num_chunks": 2, "error": None}
    assert "gate-manual.pdf" in [f.filename for f in client.files.list()]
    answer, sources = ask(client, "What is the north gate access code?")
    assert sources[0] == "gate-manual.pdf"
    assert "4417" in answer


def test_a_deleted_document_is_no_longer_cited(knowledge):
    served, kb = knowledge
    client = client_of(served)
    text = f"# Pool rules\n\n{DOCX_FACT} Children swim with an adult.\n"
    reply = httpx.post(
        f"{served.base_url}/files",
        json={"filename": "pool-rules.md", "text": text},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    sent_id = reply.json()["id"]
    processed(client, sent_id)
    question = "When does the pool open on weekdays?"
    assert "pool-rules.md" in ask(client, question)[1]

    deleted = client.files.delete(sent_id)
    assert deleted.deleted and deleted.id == sent_id
    assert "pool-rules.md" not in [f.filename for f in client.files.list()]
    assert not any(s.endswith("pool-rules.md") for s in kb.sources())
    assert "pool-rules.md" not in ask(client, question)[1]


def test_openai_embeddings_embed_through_the_server_as_the_knowledge_base_does(knowledge):
    langchain_openai = pytest.importorskip("langchain_openai")
    served, kb = knowledge
    texts = ["Where are bicycles stored?", "The pool opens early."]
    expected = np.array(kb.embedder.embed_documents(texts))
    embeddings = langchain_openai.OpenAIEmbeddings(
        model="all-MiniLM-L6-v2",
        base_url=served.base_url,
        api_key=API_KEY,
        check_embedding_ctx_length=False,  # send texts, not tiktoken ids
    )
    np.testing.assert_allclose(embeddings.embed_documents(texts), expected, atol=1e-6)
    np.testing.assert_allclose(embeddings.embed_query(texts[0]), expected[0], atol=1e-6)
    response = client_of(served).embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    assert response.model == "all-MiniLM-L6-v2" and response.usage.prompt_tokens > len(texts)
    np.testing.assert_allclose([d.embedding for d in response.data], expected, atol=1e-6)


def scrape(served: Served) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    reply = httpx.get(f"{served.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def test_metrics_move_with_ten_requests(knowledge):
    served, _ = knowledge
    client = client_of(served)
    before = scrape(served)
    for idx in range(10):
        ask(client, ["Where are bicycles stored?", "What is stored in the basement?"][idx % 2])
    after = scrape(served)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("adarag_requests_total", route="chat", outcome="ok") == 10
    assert moved("adarag_time_to_first_token_seconds_count") == 10
    assert moved("adarag_recomputed_ratio_count") == 10
    tiers = {labels[0][1] for name, labels in after if name == "adarag_kv_lookups_total"}
    assert sum(moved("adarag_kv_lookups_total", tier=tier) for tier in tiers) >= 10
    assert moved("adarag_kv_lookups_total", tier="hard") > 0  # asked again: the exact prefix
    assert moved("adarag_prompt_tokens_total") > 0
    assert after[("adarag_kv_store_bytes", (("layer", "memory"),))] > 0
    assert after[("adarag_queued_requests", ())] == 0
