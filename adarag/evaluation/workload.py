"""Benchmark questions and the query stream that replays them with power-law repeats.

musique and hotpotqa records carry their passages: each question's top-k chunks are ranked by
BM25 among its own passages. 2wikimqa questions retrieve from the shared corpus through a
retriever (the Chroma knowledge base, or BM25 over the corpus when none is given).
``2wikimqa-gold`` builds each question's context from the corpus: its gold passages (by title)
and random distractor passages up to k, shuffled (seeded by the question id). ``2wikimqa-short``
is built the same way with fewer chunks (short prompts of a few hundred tokens, like a
single-passage lookup over a handful of candidates).

The stream. Each question gets a popularity rank (a seeded random permutation); a query picks
rank ``r`` with probability proportional to ``1 / r^s`` (Zipf, default ``s = 1.1``, as chunk
popularity in RAG follows a power law -- AdaCache Figure 1a). Every question is asked once first
(in random order, "cold"), then the remaining queries are drawn from that distribution ("warm"
repeats), so cold and warm figures can be reported separately.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from adarag.retrievers import MemoryRetriever, Retriever
from adarag.retrievers.chunking import passage_text
from adarag.schema import Chunk

DATASETS = ("musique", "hotpotqa", "2wikimqa", "2wikimqa-gold", "2wikimqa-short")
GOLD_CONTEXT_DATASETS = ("2wikimqa-gold", "2wikimqa-short")
FIDELITY_CHUNKS = {
    "musique": 4,
    "hotpotqa": 6,
    "2wikimqa": 6,
    "2wikimqa-gold": 6,
    "2wikimqa-short": 4,
}
"""Chunks per question of each data set in the fidelity benchmark and the selector's labels."""
CALIBRATION_QUESTIONS = 40
"""Questions #0-39 of each data set calibrate (fit, choose); the report split starts after."""
CORPUS_FILE = "2wikimqa_corpus.jsonl"
DATA_DIR_ENV = "ADARAG_DATA_DIR"
DEFAULT_DATA_DIR = Path(os.environ.get(DATA_DIR_ENV, "data"))
"""Where the QA data sets' dev files are read from unless ``--data-dir`` says otherwise:
``$ADARAG_DATA_DIR``, else ``./data``."""


@dataclass(frozen=True)
class BenchQuestion:
    """A question with gold answers and its retrieved chunks, best first.

    Attributes:
        qtype: The question's type where the dataset has one (2WikiMultihopQA: comparison,
            bridge_comparison, compositional, inference).
        conversation: The conversation the question is a turn of (multi-turn workloads), asked
            after the earlier turns of the same conversation; None for a single-shot question.
    """

    qid: str
    question: str
    answers: tuple[str, ...]
    chunks: tuple[str, ...]
    qtype: str | None = None
    conversation: str | None = None


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
    source = "2wikimqa" if dataset.startswith("2wikimqa") else dataset
    rows = _rows(data_dir / f"{source}_dev.jsonl")
    corpus = _corpus(data_dir) if source == "2wikimqa" else []
    if dataset == "2wikimqa" and corpus_retriever is None:
        corpus_retriever = MemoryRetriever(corpus)
    questions = []
    for row in rows[offset:]:
        if dataset in GOLD_CONTEXT_DATASETS:
            texts = _gold_context(row, corpus, top_k)
        else:
            if corpus_retriever is not None:
                found = corpus_retriever.retrieve(row["question"], top_k)
            else:
                own = [Chunk(passage_text(p["text"], p.get("title"))) for p in row["passages"]]
                found = MemoryRetriever(own).retrieve(row["question"], top_k)
            texts = [chunk.text for chunk in found]
        if len(texts) == top_k:
            answers = tuple(row["answers"])
            item = BenchQuestion(str(row["id"]), row["question"], answers, tuple(texts))
            questions.append(replace(item, qtype=row.get("type")))
        if len(questions) == limit:
            break
    return questions


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _corpus(data_dir: Path) -> list[Chunk]:
    """The 2WikiMultihopQA corpus as chunks (title line + text), with their titles."""
    return [
        Chunk(passage_text(row["text"], row["title"]), row["id"], metadata={"title": row["title"]})
        for row in _rows(data_dir / CORPUS_FILE)
    ]


def _gold_context(row: dict, corpus: list[Chunk], top_k: int) -> list[str]:
    """The question's gold passages and random distractors up to ``top_k``, shuffled.

    Empty when the question has no gold passage in the corpus or more than ``top_k``.
    """
    titles = set(row.get("gold_titles") or ())
    gold = [chunk.text for chunk in corpus if chunk.metadata["title"] in titles]
    if not gold or len(gold) > top_k:
        return []
    rng = random.Random(int(hashlib.sha256(str(row["id"]).encode()).hexdigest()[:8], 16))
    others = [chunk.text for chunk in corpus if chunk.metadata["title"] not in titles]
    context = gold + rng.sample(others, top_k - len(gold))
    rng.shuffle(context)
    return context


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


def distinct_chunks(questions: Sequence[BenchQuestion]) -> list[str]:
    """Every chunk of the questions, once, in first-seen order."""
    return list(dict.fromkeys(chunk for q in questions for chunk in q.chunks))
