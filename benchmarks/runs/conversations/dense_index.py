"""Cosine search over the 2WikiMultihopQA corpus with the knowledge base's embedder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from adarag import Chunk
from adarag.retrievers.chunking import passage_text
from adarag.retrievers.embedding import SentenceEmbedder


class DenseIndex:
    """Cosine search over the corpus with the knowledge base's embedder (cached on disk)."""

    def __init__(self, corpus: list[dict], cache: Path) -> None:
        self.chunks = [
            Chunk(
                passage_text(row["text"], row["title"]),
                chunk_id=str(row["id"]),
                metadata={"title": row["title"]},
            )
            for row in corpus
        ]
        self.embedder = SentenceEmbedder()
        if cache.is_file():
            self.matrix = np.load(cache)
        else:
            self.matrix = np.asarray(
                self.embedder.embed_documents([c.text for c in self.chunks]), dtype=np.float32
            )
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, self.matrix)
        assert self.matrix.shape[0] == len(self.chunks), "stale embedding cache; delete it"

    def search(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` most similar passages, best first."""
        scores = self.matrix @ np.asarray(self.embedder.embed_query(query), dtype=np.float32)
        order = np.argsort(-scores)[:top_k]
        return [self.chunks[idx] for idx in order]
