"""Two-turn conversations built from 2WikiMultihopQA compositional questions, and a dense index.

"Where was the director of film Blood Street born?" becomes the first question "Who is the
director of film Blood Street?" and the follow-up "Where was this person born?", whose gold
passage is the person's (the gold title that is not the film's) and whose answer is the original
question's. Questions about "X's father" (mother, husband, ...) are split the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adarag.retrievers.chunking import passage_text
from adarag.retrievers.embedding import SentenceEmbedder
from adarag.schema import Chunk

_ROLE = re.compile(
    r"the (director|performer|composer) of (film|song) (.+?)"
    r"(?= born| die| work| study| detained|\?)",
    re.IGNORECASE,
)
_RELATIVE = re.compile(r"([A-Z][^?]*?)'s (father|mother|husband|wife|son|daughter|child)\b")
_REFERENCE = "this person"


@dataclass(frozen=True)
class FollowUp:
    """A first question, a follow-up referring to its answer, and the follow-up's gold."""

    first: str
    follow_up: str
    original: str
    gold_title: str
    gold_titles: tuple[str, ...]
    answers: tuple[str, ...]


def _plain(title: str) -> str:
    return re.sub(r"\s*\(.*?\)\s*", " ", title).strip().lower()


def build_followups(rows: list[dict], limit: int) -> list[FollowUp]:
    """Up to ``limit`` follow-ups from compositional questions with two gold titles."""
    found = []
    for row in rows:
        titles = row.get("gold_titles") or []
        if row.get("type") != "compositional" or len(titles) != 2:
            continue
        question = row["question"]
        role = _ROLE.search(question)
        relative = _RELATIVE.search(question)
        if role is not None:
            subject = role.group(3)
            first = f"Who is the {role.group(1).lower()} of {role.group(2).lower()} {subject}?"
            follow_up = question[: role.start()] + _REFERENCE + question[role.end() :]
        elif relative is not None:
            subject = relative.group(1)
            first = f"Who is {subject}'s {relative.group(2)}?"
            follow_up = question[: relative.start()] + _REFERENCE + question[relative.end() :]
        else:
            continue
        others = [t for t in titles if _plain(t) != _plain(subject)]
        if len(others) != 1:
            continue
        found.append(
            FollowUp(
                first,
                follow_up[0].upper() + follow_up[1:],
                question,
                others[0],
                tuple(titles),
                tuple(row["answers"]),
            )
        )
        if len(found) == limit:
            break
    return found


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
