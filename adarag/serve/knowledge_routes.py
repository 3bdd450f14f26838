"""The routes around the knowledge base: documents, embeddings, metrics and the chat page."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from fastapi import FastAPI, Request

from adarag.config import ServeConfig
from adarag.retrievers import Embedder, KnowledgeBase, SentenceEmbedder
from adarag.serve.chat_page import chat_page_router
from adarag.serve.documents import DocumentLibrary
from adarag.serve.embeddings import embeddings_router
from adarag.serve.files import files_router
from adarag.serve.metrics import metrics_router
from adarag.serve.parse_worker import DocumentParser
from adarag.serve.service import EngineService
from adarag.serve.uploads import Uploads


def add_knowledge_routes(
    app: FastAPI,
    service: EngineService,
    config: ServeConfig,
    check_key: Callable[[Request], None],
) -> DocumentLibrary | None:
    """Add ``/v1/files``, ``/v1/embeddings``, ``/metrics`` and the chat page to ``app``.

    Returns:
        The documents of the knowledge base (to close when the server stops), or None when
        the pipeline's retriever is not a :class:`KnowledgeBase`.
    """
    rag = service.rag
    kb = rag.retriever if isinstance(rag.retriever, KnowledgeBase) else None
    library = uploads = None
    if kb is not None:
        directory = config.documents_directory or rag.config.home / "documents"
        library = DocumentLibrary(rag, kb, directory)
        parser = DocumentParser(rag.config.retrieval)
        service.call_on_shutdown(parser.close)  # parses are killed, not waited for
        uploads = Uploads(library, parser, config)

    @cache
    def embedder() -> Embedder:
        if kb is not None:
            return kb.embedder
        retrieval = rag.config.retrieval
        return SentenceEmbedder(retrieval.embedding_model, retrieval.embedding_batch_size)

    app.include_router(files_router(uploads, check_key))
    app.include_router(embeddings_router(embedder, service.metrics, check_key))
    app.include_router(metrics_router(service.metrics, check_key))
    app.include_router(chat_page_router())
    return library
