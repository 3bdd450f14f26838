"""Sentence- and heading-aware splitting of documents into chunks of model tokens.

A chunk holds whole sentences (a line, or text ending in ``.``, ``!`` or ``?`` before
whitespace) up to ``chunk_tokens`` tokens of the model's tokenizer; only a sentence longer than
the budget is cut inside, between words (:func:`split_by_tokens`). A markdown file is first cut
into sections at its headings (outside fenced code), each section split on its own: its first
chunk starts with the heading, and every chunk of it records the heading path (each heading
shortened to :data:`MAX_HEADING_CHARS`). Editing one
section then changes only that section's chunks, so the others keep their content-hashed ids.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from adarag.retrievers.chunking import TokenSpans, split_by_tokens
from adarag.retrievers.sources import MARKDOWN_SUFFIXES

MAX_HEADING_CHARS = 200
"""A longer heading is shortened in the heading path every chunk of its section records."""

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*[ \t]+|\n+")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True)
class Section:
    """A markdown section: its heading path (``"Guide > Install"``; None before any heading)."""

    heading: str | None
    text: str


def split_document(
    text: str,
    path: Path,
    splitter: Literal["tokens", "sentences", "markdown"],
    token_spans: TokenSpans,
    chunk_tokens: int,
    overlap_tokens: int,
    *,
    has_headings: bool = False,
) -> list[tuple[str | None, str]]:
    """A document's chunks as ``(heading path or None, text)``, by ``splitter``.

    ``"tokens"``: token windows cut between words (:func:`split_by_tokens`); ``"sentences"``:
    whole sentences (:func:`split_sentences`); ``"markdown"``: a markdown file (``.md``,
    ``.markdown``, or ``has_headings``: an HTML or Word file converted) section by section at
    its headings, any other file as ``"sentences"``.
    """
    if splitter == "tokens":
        return [
            (None, piece)
            for piece in split_by_tokens(text, token_spans, chunk_tokens, overlap_tokens)
        ]
    if splitter == "markdown" and (has_headings or path.suffix.lower() in MARKDOWN_SUFFIXES):
        sections = markdown_sections(text)
    else:
        sections = [Section(None, text)]
    return [
        (section.heading, piece)
        for section in sections
        for piece in split_sentences(section.text, token_spans, chunk_tokens, overlap_tokens)
    ]


def markdown_sections(text: str) -> list[Section]:
    """``text`` cut at its ATX headings (``#`` to ``######``), each section with its heading.

    A heading inside a fenced code block is text. The heading path joins the headings above a
    section, outermost first, with ``" > "``.
    """
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    lines: list[str] = []
    heading: str | None = None
    in_fence = False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            in_fence = not in_fence
        found = None if in_fence else atx_heading(line.rstrip("\n"))
        if found is not None:
            if "".join(lines).strip():
                sections.append(Section(heading, "".join(lines).strip()))
            level, title = found
            path = [(depth, title) for depth, title in path if depth < level]
            path.append((level, _shortened(title.strip())))
            heading = " > ".join(title for _, title in path)
            lines = []
        lines.append(line)
    if "".join(lines).strip():
        sections.append(Section(heading, "".join(lines).strip()))
    return sections


def _shortened(title: str) -> str:
    """A heading as its chunks record it: at most :data:`MAX_HEADING_CHARS` characters."""
    if len(title) <= MAX_HEADING_CHARS:
        return title
    return title[: MAX_HEADING_CHARS - 3].rstrip() + "..."


def atx_heading(line: str) -> tuple[int, str] | None:
    """``(level, title)`` of an ATX heading line (``## Title ##``), or None for other lines.

    Up to three spaces, one to six ``#``, a space or tab, the title; trailing spaces, tabs and
    ``#`` are not part of it. Parsed in one pass (no backtracking regex: a line of the form
    ``# a # # # ... x`` takes time linear in its length).
    """
    body = line.lstrip(" ")
    if len(line) - len(body) > 3:
        return None
    level = len(body) - len(body.lstrip("#"))
    rest = body[level:]
    if not 1 <= level <= 6 or not rest or rest[0] not in " \t":
        return None
    text = rest.lstrip(" \t")
    if text:
        return level, text[0] + text[1:].rstrip(" \t#")
    return (level, rest[-1]) if len(rest) > 1 else None  # blank title: "#  " is a heading


def split_sentences(
    text: str, token_spans: TokenSpans, chunk_tokens: int, overlap_tokens: int
) -> list[str]:
    """Chunks of whole sentences of at most ``chunk_tokens`` tokens (see module docstring).

    Neighbouring chunks share their boundary sentences up to ``overlap_tokens`` tokens.
    """
    assert 0 <= overlap_tokens < chunk_tokens, f"overlap {overlap_tokens} >= {chunk_tokens}"
    spans = list(token_spans(text))
    token_starts = [start for start, _ in spans]

    def num_tokens(start: int, end: int) -> int:
        return bisect.bisect_left(token_starts, end) - bisect.bisect_left(token_starts, start)

    sentences = _sentence_spans(text)
    chunks: list[str] = []
    first = 0
    while first < len(sentences):
        start = sentences[first][0]
        if num_tokens(start, sentences[first][1]) > chunk_tokens:  # one over-long sentence
            end = sentences[first][1]
            first_token = bisect.bisect_left(token_starts, start)
            if first_token and spans[first_token - 1][1] > start:  # " word" tokens start early
                first_token -= 1
            inside = spans[first_token : bisect.bisect_left(token_starts, end)]
            piece_spans = [  # the text's tokens, not the piece re-tokenized
                (max(a, start) - start, min(b, end) - start) for a, b in inside
            ]
            piece = text[start:end]
            chunks.extend(
                split_by_tokens(piece, token_spans, chunk_tokens, overlap_tokens, piece_spans)
            )
            first += 1
            continue
        last = first
        while last + 1 < len(sentences) and (
            num_tokens(start, sentences[last + 1][1]) <= chunk_tokens
        ):
            last += 1
        chunks.append(text[start : sentences[last][1]])
        if last + 1 == len(sentences):
            break
        following = last + 1  # overlap: the last sentences that fit in overlap_tokens
        while (
            following - 1 > first
            and num_tokens(sentences[following - 1][0], sentences[last][1]) <= overlap_tokens
            and num_tokens(sentences[following - 1][0], sentences[last + 1][1]) <= chunk_tokens
        ):  # the next chunk still reaches past this one
            following -= 1
        first = following
    return chunks


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character ``(start, end)`` of each sentence of ``text``, stripped, in order."""
    spans = []
    start = 0
    for found in [*_SENTENCE_END.finditer(text), None]:
        end = len(text) if found is None else found.start()
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))
        if found is not None:
            start = found.end()
    return spans
