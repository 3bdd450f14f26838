"""Retrieved documents found inside a chat prompt, so that their cached KV is reused.

The textbook chain ``{"context": retriever | format_docs, "question": RunnablePassthrough()} |
prompt | ChatAdaRag()`` hands the model one human message whose text holds the documents,
joined by the chunk separator (a blank line, as ``format_docs`` joins them). :func:`find_context`
looks in that message for documents whose KV adarag holds (warmed by ``adarag ingest``,
``chain.warm(documents)`` or an earlier answer): the first must start a line, each ends at a
separator or at the end of the text. The text before the first is the context's opening, every
piece between the first and the last is a chunk (one not cached yet is computed and kept), and
the text after the last is the question, so adarag's layout of the prompt is the message's own
text and each recognised document's KV is reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

MAX_PIECES = 8
"""The most separator-delimited pieces one document may span."""
LOOKUP_BUDGET_RATIO = 8
"""Characters looked up (each tokenized) per character of the message, at most: a long message
holding no cached document is given up on after a few milliseconds' work."""


@dataclass(frozen=True)
class ContextPrompt:
    """A prompt read as adarag's layout: system prompt, opening, chunks and question."""

    system_prompt: str | None
    context_intro: str
    chunks: tuple[str, ...]
    question: str


def find_context(rag: Any, messages: Sequence[BaseMessage]) -> ContextPrompt | None:
    """The prompt as adarag's layout, or None when it holds no cached document.

    Only a prompt of one human message (after an optional system message) is read; the
    documents must be in the human message.
    """
    types = [message.type for message in messages]
    if types not in (["human"], ["system", "human"]):
        return None
    system_prompt = messages[0].text if types[0] == "system" else None
    text = messages[-1].text
    separator = rag.config.prompt.chunk_separator
    pieces = text.split(separator)
    lookup = _Lookup(rag, LOOKUP_BUDGET_RATIO * len(text) + 4096)
    runs = _cached_runs(lookup, pieces, separator)
    if not runs:
        return None
    (first_idx, first_offset, _), last_end = runs[0], runs[-1][2]
    chunks: list[str] = []
    cursor = first_idx
    for idx, offset, end in runs:
        if idx > cursor:  # pieces between cached documents: a document not cached yet
            chunks.append(separator.join(pieces[cursor:idx]))
        chunks.append(separator.join([pieces[idx][offset:], *pieces[idx + 1 : end]]))
        cursor = end
    intro = separator.join([*pieces[:first_idx], pieces[first_idx][:first_offset]])
    question = separator.join(pieces[last_end:])
    if not question.strip():
        return None  # adarag's layout needs a question after the context
    return ContextPrompt(system_prompt, intro, tuple(chunks), question)


class _Lookup:
    """Whether texts are chunks whose KV is cached, within a budget of characters."""

    def __init__(self, rag: Any, budget_chars: int) -> None:
        self.rag = rag
        self.budget_chars = budget_chars

    @property
    def is_spent(self) -> bool:
        return self.budget_chars <= 0

    def is_cached(self, text: str) -> bool:
        if self.is_spent or not text.strip():
            return False
        self.budget_chars -= len(text)
        return bool(self.rag.cache.has_independent(self.rag.prompts.chunk_ids(text)))


def _cached_runs(lookup: _Lookup, pieces: list[str], separator: str) -> list[tuple[int, int, int]]:
    """``(first piece, offset in it, end piece)`` of each cached document, in order.

    The first may start at any line of its piece; the next ones start at a piece.
    """
    runs: list[tuple[int, int, int]] = []
    idx = 0
    while idx < len(pieces) and not lookup.is_spent:
        offsets = _line_starts(pieces[idx]) if not runs else [0]
        found = _shortest_cached(lookup, pieces, separator, idx, offsets)
        if found is None:
            idx += 1
            continue
        runs.append(found)
        idx = found[2]
    return runs


def _shortest_cached(
    lookup: _Lookup, pieces: list[str], separator: str, idx: int, offsets: list[int]
) -> tuple[int, int, int] | None:
    for offset in offsets:
        for end in range(idx + 1, min(len(pieces), idx + MAX_PIECES) + 1):
            if lookup.is_cached(separator.join([pieces[idx][offset:], *pieces[idx + 1 : end]])):
                return idx, offset, end
    return None


def _line_starts(piece: str) -> list[int]:
    """The offset of each line of ``piece``."""
    return [0] + [idx + 1 for idx, char in enumerate(piece) if char == "\n"]
