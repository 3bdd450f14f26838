"""``adarag demo`` answers before it warms the corpus: only its questions' chunks come first."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import adarag.cli.demo as demo
from adarag.retrievers import IngestReport
from adarag.schema import Chunk

NUM_CORPUS_CHUNKS = 40
TOP_K = 4


class _KnowledgeBase:
    """The demo corpus as chunk ids ``c0``...; retrieval is a question's fixed slice of them."""

    def __init__(self) -> None:
        self.stored = [
            Chunk(text=f"passage {idx}", chunk_id=f"c{idx}") for idx in range(NUM_CORPUS_CHUNKS)
        ]
        self.config = SimpleNamespace(collection="adarag-demo")
        self.directory = None

    def ingest(self, paths, **_):
        return IngestReport(
            num_files=1,
            num_files_unchanged=0,
            num_chunks_kept=0,
            num_chunks_removed=0,
            added=tuple(self.stored),
            sources=("demo_corpus.jsonl",),
        )

    def count(self) -> int:
        return len(self.stored)

    def chunks(self, sources=None) -> list[Chunk]:
        return list(self.stored)


class _Pipeline:
    """Counts warmed chunks, and how many were warmed when the first answer started."""

    def __init__(self, kb: _KnowledgeBase) -> None:
        self.kb = kb
        self.tokenizer = None
        self.cache_disk_problem = None
        self.warmed: set[str] = set()
        self.warmed_before_answers: set[str] | None = None
        self.retrieved: set[str] = set()

    def retrieve(self, question: str, top_k=None) -> list[Chunk]:
        start = (len(question) * 7) % (NUM_CORPUS_CHUNKS - TOP_K)
        chunks = self.kb.stored[start : start + TOP_K]
        self.retrieved.update(chunk.chunk_id for chunk in chunks)
        return chunks

    def warm(self, chunks) -> int:
        new = {chunk.chunk_id for chunk in chunks} - self.warmed
        self.warmed |= new
        return len(new)

    def stream(self, question: str, params=None):
        if self.warmed_before_answers is None:
            self.warmed_before_answers = set(self.warmed)
        self.retrieve(question)
        return question


def test_the_demo_warms_only_its_questions_chunks_before_the_first_answer(monkeypatch, capsys):
    kb = _KnowledgeBase()
    pipeline = _Pipeline(kb)
    monkeypatch.setattr(
        demo, "KnowledgeBase", SimpleNamespace(from_config=lambda config: nullcontext(kb))
    )
    monkeypatch.setattr(demo, "AdaRAG", lambda config, retriever: pipeline)
    monkeypatch.setattr(demo, "stream_answer", lambda stream: stream)
    monkeypatch.setattr(demo, "describe", lambda answer: [])
    from adarag.cli import build_parser

    args = build_parser().parse_args(["demo", "--questions", "3"])
    assert demo.run(args) == 0

    assert pipeline.warmed_before_answers is not None, "no question was answered"
    assert pipeline.warmed_before_answers == pipeline.retrieved  # what the answers read is warm
    assert len(pipeline.warmed_before_answers) <= 3 * TOP_K
    assert pipeline.warmed == {chunk.chunk_id for chunk in kb.stored}  # the rest after them
    out = capsys.readouterr().out
    assert out.index("Q: ") < out.rindex("precomputed the KV")
