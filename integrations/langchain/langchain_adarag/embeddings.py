"""AdaRagEmbeddings: adarag's offline sentence embedder as LangChain ``Embeddings``."""

from __future__ import annotations

from langchain_core.embeddings import Embeddings

from adarag.retrievers import Embedder, SentenceEmbedder


class AdaRagEmbeddings(Embeddings):
    """The embedder adarag's knowledge base uses, for LangChain vector stores that should match.

    all-MiniLM-L6-v2 by default, read offline, vectors L2-normalised.

    Instantiate:
        >>> from langchain_adarag import AdaRagEmbeddings
        >>> embeddings = AdaRagEmbeddings()  # or AdaRagEmbeddings(model="/path/to/st-model")
        >>> store = InMemoryVectorStore(embeddings)

    Args:
        model: ``"default"`` or a local sentence-transformers directory.
        embedder: An adarag embedder to wrap instead (e.g. a knowledge base's).
    """

    def __init__(self, model: str = "default", *, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or SentenceEmbedder(model)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One embedding per text."""
        return self.embedder.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        """The embedding of a query."""
        return self.embedder.embed_query(text)
