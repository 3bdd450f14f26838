"""Knowledge bases of the benchmark data sets, for questions answered by real retrieval.

2WikiMultihopQA ships a corpus (6,119 passages). HotpotQA and MuSiQue ship each question's own
passages; their corpora pool every question's passages (HotpotQA: one passage per title, 2,964;
MuSiQue: 861 distinct ~415-word passages cut into windows of about 100 words, so a chunk is a
retrievable unit of the size of the others). No question's gold passage is forced into its
context: what a retriever ranks is what the prompt holds.

A chunk is *gold* for a question when it is one of the question's evidence passages (2Wiki's
``gold_titles``, HotpotQA's supporting paragraphs) or, for MuSiQue (whose records mark no
evidence), when it contains a gold answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from adarag.evaluation.metrics import normalize_answer
from adarag.retrievers.chunking import passage_text
from adarag.schema import Chunk

RETRIEVAL_DATASETS = ("2wikimqa", "hotpotqa", "musique")
WINDOW_WORDS = 100


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def questions(dataset: str, data_dir: Path) -> list[dict]:
    """The data set's question records (``{id, question, answers, ...}``)."""
    _check(dataset)
    return _rows(data_dir / f"{dataset}_dev.jsonl")


def corpus_chunks(dataset: str, data_dir: Path) -> list[Chunk]:
    """The data set's knowledge base as chunks with stable ids (and titles where there are)."""
    _check(dataset)
    if dataset == "2wikimqa":
        return [
            Chunk(
                passage_text(row["text"], row["title"]),
                f"2wiki-{row['id']}",
                None,
                {"title": row["title"]},
            )
            for row in _rows(data_dir / "2wikimqa_corpus.jsonl")
        ]
    chunks: dict[str, Chunk] = {}
    for row in questions(dataset, data_dir):
        for passage in row["passages"]:
            if dataset == "hotpotqa":
                title = passage["title"]
                chunk = Chunk(
                    passage_text(passage["text"], title), f"hotpot-{title}", None, {"title": title}
                )
                chunks.setdefault(str(chunk.chunk_id), chunk)
                continue
            for text in word_windows(passage["text"], WINDOW_WORDS):
                chunks.setdefault(text, Chunk(text, f"musique-{len(chunks)}"))
    return list(chunks.values())


def word_windows(text: str, size: int) -> list[str]:
    """``text`` cut into consecutive windows of ``size`` words (the last may be shorter)."""
    words = text.split()
    return [" ".join(words[start : start + size]) for start in range(0, len(words), size)]


def gold_titles(dataset: str, row: dict) -> set[str]:
    """Titles of the question's evidence passages (empty for MuSiQue, which marks none)."""
    if dataset == "2wikimqa":
        return set(row.get("gold_titles") or ())
    if dataset == "hotpotqa":
        return {p["title"] for p in row["passages"] if p.get("supporting")}
    return set()


def is_gold(chunk: Chunk, titles: set[str], answers: Sequence[str]) -> bool:
    """Whether ``chunk`` is an evidence passage (by title) or, without titles, holds an answer."""
    title = chunk.metadata.get("title")
    if titles:
        return title in titles
    text = f" {normalize_answer(chunk.text)} "
    return any(f" {normalize_answer(answer)} " in text for answer in answers if answer.strip())


def _check(dataset: str) -> None:
    if dataset not in RETRIEVAL_DATASETS:
        raise ValueError(
            f"unknown dataset {dataset!r}; choose from {', '.join(RETRIEVAL_DATASETS)}"
        )
