"""A printed document's pages without running headers, footers or ligatures.

A PDF's text layer repeats the running header and footer (a title, "Page 3 of 12") on every
page, and keeps presentation forms such as the ``fi`` ligature (U+FB01), which neither a
search nor an embedding matches with ``fi``. :func:`clean_pages` NFKC-normalises each page
(the standard library's :mod:`unicodedata`: ligatures, full-width forms and non-breaking
spaces become their plain letters) and drops, from the first and last :data:`EDGE_LINES` lines
of each page, the lines found there on most pages (digits count as one, so "Page 3" and "Page
4" are the same line). Documents of fewer than :data:`MIN_PAGES` pages with text are kept as
they are: two pages do not tell a running header from a repeated line.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

EDGE_LINES = 3
"""The lines at the top and at the bottom of a page that may be a running header or footer."""
MIN_PAGES = 3
"""Running lines are looked for in documents with at least this many pages with text."""
_DIGITS = re.compile(r"\d+")


def clean_pages(pages: list[str]) -> list[str]:
    """Each page's text NFKC-normalised, without the lines repeated at the edges of most pages.

    Args:
        pages: One text per page, in order (an empty text for a page without text).

    Returns:
        The pages in the same order; a page that held only running lines is empty.
    """
    normalised = [unicodedata.normalize("NFKC", page) for page in pages]
    split = [page.split("\n") for page in normalised]
    num_with_text = sum(1 for page in normalised if page.strip())
    if num_with_text < MIN_PAGES:
        return normalised
    counts: Counter[str] = Counter()
    for lines in split:
        counts.update({key for key in map(_line_key, _edges(lines)) if key})
    running = {key for key, count in counts.items() if count * 2 > num_with_text}
    if not running:
        return normalised
    return ["\n".join(_without_running(lines, running)).strip() for lines in split]


def _edges(lines: list[str]) -> list[str]:
    """The first and last :data:`EDGE_LINES` non-blank lines of a page."""
    filled = [line for line in lines if line.strip()]
    return filled[:EDGE_LINES] + filled[-EDGE_LINES:]


def _without_running(lines: list[str], running: set[str]) -> list[str]:
    """``lines`` less the running ones among the edge lines."""
    filled = [idx for idx, line in enumerate(lines) if line.strip()]
    edge = set(filled[:EDGE_LINES] + filled[-EDGE_LINES:])
    return [
        line for idx, line in enumerate(lines) if idx not in edge or _line_key(line) not in running
    ]


def _line_key(line: str) -> str:
    """A line as compared across pages: whitespace collapsed, digits as ``#``, case folded."""
    return _DIGITS.sub("#", " ".join(line.split())).casefold()
