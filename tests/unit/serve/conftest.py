"""A served tiny model over an in-memory Chroma knowledge base, in-process (no socket)."""

from __future__ import annotations

import uuid

import pytest

KEY = "docs-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory):
    """(client, rag, kb, documents directory) of a server over a one-chunk knowledge base."""
    chromadb = pytest.importorskip("chromadb")
    from fastapi.testclient import TestClient

    from adarag import AdaRAG, AdaRagConfig, Chunk
    from adarag.config import ServeConfig
    from adarag.retrievers import KnowledgeBase
    from adarag.serve import create_app
    from tests.unit.retrievers.test_knowledge_base import WordEmbedder

    home = tmp_path_factory.mktemp("docs-home")
    config = AdaRagConfig.build(
        home=home,
        engine={"model": str(tiny_checkpoints["llama"])},
        augment={"enabled": False},
        experimental={"augment": {"num_lens_layers": 2}},
        retrieval={"collection": f"docs-{uuid.uuid4().hex[:8]}", "top_k": 2},
    )
    kb = KnowledgeBase(config.retrieval, client=chromadb.EphemeralClient(), embedder=WordEmbedder())
    rag = AdaRAG(config, retriever=kb)
    kb.add_chunks([Chunk("the lodge closes at night and the gate stays shut")], source="base.md")
    app = create_app(rag, ServeConfig(max_upload_bytes=64 * 1024), api_key=KEY)
    with TestClient(app) as client:
        yield client, rag, kb, home / "documents"
