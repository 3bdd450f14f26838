"""Benchmark questions and the query stream that replays them with power-law repeats.

musique and hotpotqa records carry their passages: each question's top-k chunks are ranked by
BM25 among its own passages. 2wikimqa questions retrieve from the shared corpus through a
retriever (the Chroma knowledge base).

The stream. Each question gets a popularity rank (a seeded random permutation); a query picks
rank ``r`` with probability proportional to ``1 / r^s`` (Zipf, default ``s = 1.1``, as chunk
popularity in RAG follows a power law -- AdaCache Figure 1a). Every question is asked once first
(in random order, "cold"), then the remaining queries are drawn from that distribution ("warm"
repeats), so cold and warm figures can be reported separately.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from adarag.retrievers import MemoryRetriever, Retriever
from adarag.schema import Chunk

DATASETS = ("musique", "hotpotqa", "2wikimqa")


@dataclass(frozen=True)
class BenchQuestion:
    """A question with gold answers and its retrieved chunks, best first."""

    qid: str
    question: str
    answers: tuple[str, ...]
    chunks: tuple[str, ...]


@dataclass(frozen=True)
class StreamItem:
    """One query of the stream: which question, and whether it was asked before."""

    question_idx: int
    is_repeat: bool


def load_questions(
    dataset: str,
    data_dir: Path,
    limit: int,
    top_k: int,
    offset: int = 0,
    corpus_retriever: Retriever | None = None,
) -> list[BenchQuestion]:
    """The first ``limit`` questions (after ``offset``) with ``top_k`` chunks each."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    path = data_dir / f"{dataset}_dev.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    questions = []
    for row in rows[offset:]:
        if dataset == "2wikimqa":
            if corpus_retriever is None:
                raise ValueError("2wikimqa retrieves from its corpus: pass corpus_retriever")
            found = corpus_retriever.retrieve(row["question"], top_k)
        else:
            passages = [Chunk(_passage_text(p)) for p in row["passages"]]
            found = MemoryRetriever(passages).retrieve(row["question"], top_k)
        if len(found) == top_k:
            questions.append(
                BenchQuestion(
                    str(row["id"]),
                    row["question"],
                    tuple(row["answers"]),
                    tuple(chunk.text for chunk in found),
                )
            )
        if len(questions) == limit:
            break
    return questions


def query_stream(
    num_questions: int, num_queries: int, zipf_s: float, seed: int
) -> list[StreamItem]:
    """Every question once (cold), then power-law repeats up to ``num_queries`` (warm)."""
    rng = random.Random(seed)
    first = list(range(num_questions))
    rng.shuffle(first)
    ranked = list(range(num_questions))
    rng.shuffle(ranked)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(num_questions)]
    repeats = rng.choices(ranked, weights=weights, k=max(num_queries - num_questions, 0))
    return [StreamItem(idx, False) for idx in first] + [StreamItem(idx, True) for idx in repeats]


def corpus_chunks(path: Path) -> list[Chunk]:
    """The 2wikimqa corpus as chunks (title line + text)."""
    chunks = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            chunks.append(
                Chunk(
                    _passage_text(record),
                    chunk_id=record["id"],
                    metadata={"title": record["title"]},
                )
            )
    return chunks


def _passage_text(passage: dict[str, str]) -> str:
    title = passage.get("title")
    return f"{title}\n{passage['text']}" if title else passage["text"]


def distinct_chunks(questions: Sequence[BenchQuestion]) -> list[str]:
    """Every chunk of the questions, once, in first-seen order."""
    return list(dict.fromkeys(chunk for q in questions for chunk in q.chunks))
