"""A server over a knowledge base that starts empty: it says so, answers how to fill it, and is
filled over HTTP."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

chromadb = pytest.importorskip("chromadb")
openai = pytest.importorskip("openai")
pytest.importorskip("multipart")

from tests.reliability.http_server import serving  # noqa: E402
from tests.unit.retrievers.test_knowledge_base import WordEmbedder  # noqa: E402

KEY = "empty-key"
QUESTION = "where do the spare keys hang?"


def test_an_empty_knowledge_base_starts_says_how_to_fill_it_and_answers_once_filled(
    tiny_checkpoints, tmp_path, caplog
):
    from adarag import AdaRAG, AdaRagConfig
    from adarag.retrievers import KnowledgeBase

    config = AdaRagConfig.build(
        home=tmp_path,
        engine={"model": str(tiny_checkpoints["llama"])},
        augment={"enabled": False},
        experimental={"augment": {"num_lens_layers": 2}},
        retrieval={"collection": f"empty-{uuid.uuid4().hex[:8]}", "top_k": 2},
    )
    kb = KnowledgeBase(config.retrieval, client=chromadb.EphemeralClient(), embedder=WordEmbedder())
    rag = AdaRAG(config, retriever=kb)
    caplog.set_level(logging.INFO, logger="adarag")
    with serving(rag, KEY, documents_directory=tmp_path / "documents") as served:
        started = [
            r.getMessage() for r in caplog.records if "knowledge base is empty" in r.getMessage()
        ]
        assert started and "/v1/files" in started[0] and "chat page" in started[0]
        client = openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=120)
        with pytest.raises(openai.ConflictError) as raised:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": QUESTION}], max_tokens=2
            )
        message = raised.value.body["message"]
        assert "knowledge base is empty" in message and "/v1/files" in message
        assert "adarag ingest" not in message  # the server holds the directory: ingest cannot
        sent = client.files.create(
            file=("keys.md", b"# Keys\n\nthe spare keys hang in the porch cupboard.\n"),
            purpose="assistants",
        )
        deadline = time.monotonic() + 120
        while client.files.retrieve(sent.id).status == "uploaded":
            assert time.monotonic() < deadline, "the document was not processed in time"
            time.sleep(0.05)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTION}], max_tokens=2
        )
        sources = [s["metadata"]["source"] for s in reply.model_extra["adarag"]["sources"]]
        assert sources == ["keys.md"]
