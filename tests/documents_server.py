"""A served knowledge base of its own holding one markdown file, for the document-route tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adarag.retrievers import KnowledgeBase
from tests.documents import MD_FACT
from tests.reliability.http_server import Served, serving


@contextmanager
def markdown_knowledge_server(
    shared_rag: Any, root: Path, collection: str, api_key: str, **serve_options: Any
) -> Iterator[tuple[Served, KnowledgeBase]]:
    """``adarag serve`` over a knowledge base (under ``root``) holding ``MD_FACT``, warmed."""
    rag = shared_rag.with_config(
        cache={"store": {"directory": str(root / "kv")}}, augment={"enabled": False}
    )
    retrieval = rag.config.retrieval.model_copy(
        update={"chroma_directory": root / "chroma", "collection": collection, "top_k": 3}
    )
    storage = root / "storage.md"
    storage.write_text(f"# Storage\n\n{MD_FACT}\n")
    with KnowledgeBase(retrieval) as kb:
        rag.warm(kb.ingest([storage], tokenizer=rag.tokenizer).added)
        rag.retriever = kb
        documents = root / "documents"
        with serving(rag, api_key, documents_directory=documents, **serve_options) as served:
            yield served, kb
