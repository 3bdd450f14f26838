"""Bundled data: a 240-passage slice of the 2WikiMultihopQA corpus (Apache-2.0) and questions.

``calibration_questions.jsonl`` holds the questions ``adarag calibrate`` fits the learned
controllers on when no data is given: 20 each of MuSiQue (CC BY 4.0), HotpotQA (CC BY-SA 4.0)
and 2WikiMultihopQA (Apache-2.0), from their calibration split, each with its chunks
(``scripts/bundle_calibration.py`` writes it).
"""

from __future__ import annotations

import json
from importlib import resources

from adarag.retrievers.chunking import passage_text
from adarag.schema import Chunk


def demo_corpus() -> list[Chunk]:
    """The bundled demo passages as chunks (title line + text)."""
    rows = resources.files(__name__).joinpath("demo_corpus.jsonl").read_text().splitlines()
    chunks = []
    for line in rows:
        record = json.loads(line)
        text = passage_text(record["text"], record["title"])
        chunks.append(Chunk(text, chunk_id=record["id"], metadata={"title": record["title"]}))
    return chunks


def demo_questions() -> list[dict[str, object]]:
    """Questions answerable from the demo corpus, with gold answers."""
    text = resources.files(__name__).joinpath("demo_questions.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def calibration_questions() -> list[dict[str, object]]:
    """Calibration questions with their chunks: ``{dataset, qid, question, answers, chunks}``."""
    text = resources.files(__name__).joinpath("calibration_questions.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
