"""An in-memory BM25 retriever: no dependencies, for small corpora, tests and the demo."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from adarag.errors import InputError
from adarag.schema import Chunk

_WORD = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class MemoryRetriever:
    """Okapi BM25 over chunks held in memory.

    Args:
        chunks: The corpus.
        k1: Term-frequency saturation.
        b: Length normalisation.
    """

    def __init__(self, chunks: Sequence[Chunk], k1: float = 1.5, b: float = 0.75) -> None:
        self.chunks = list(chunks)
        self.k1, self.b = k1, b
        self._term_counts = [Counter(_terms(chunk.text)) for chunk in self.chunks]
        lengths = np.array([sum(c.values()) for c in self._term_counts], dtype=np.float64)
        self._lengths = lengths
        self._mean_length = float(lengths.mean()) if len(lengths) else 0.0
        document_frequency: Counter[str] = Counter()
        for counts in self._term_counts:
            document_frequency.update(counts.keys())
        num_docs = len(self.chunks)
        self._idf = {
            term: math.log(1 + (num_docs - df + 0.5) / (df + 0.5))
            for term, df in document_frequency.items()
        }

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` chunks with the highest BM25 score (score > 0), best first.

        Raises:
            InputError: ``top_k`` is not positive.
        """
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        scores = np.zeros(len(self.chunks))
        norm = self.k1 * (1 - self.b + self.b * self._lengths / max(self._mean_length, 1e-9))
        for term in set(_terms(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            tf = np.array([counts.get(term, 0) for counts in self._term_counts], dtype=np.float64)
            scores += idf * tf * (self.k1 + 1) / (tf + norm)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [
            Chunk(
                self.chunks[i].text,
                self.chunks[i].chunk_id,
                float(scores[i]),
                self.chunks[i].metadata,
            )
            for i in order
            if scores[i] > 0
        ]
