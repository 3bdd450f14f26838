"""A web page's main content: its article without menus, breadcrumbs, cookie banners or footers.

trafilatura (the ``documents`` extra) decides what the main content is: it is a maintained
library built for this, measured on web-page benchmarks, and it works offline on the page's
markup alone. adarag keeps its own conversion of the page (:mod:`adarag.retrievers.html_text`:
headings, lists, tables, ``<pre>``) and keeps the lines of it that trafilatura found in the main
content, with the headings of their sections. A page where trafilatura finds no main content,
or none of whose lines it kept, is kept whole.
"""

from __future__ import annotations

import logging
import re

from adarag.errors import MissingDependencyError

logger = logging.getLogger(__name__)

MIN_CONTAINED_WORDS = 4
"""A line of at least this many words is kept when the main content holds it inside a longer
paragraph; a shorter one (a menu item) only when a line of the main content is exactly it."""
_WORDS = re.compile(r"\w+")
_HEADING = re.compile(r"(#{1,6}) ")


def main_content(markup: str, text: str) -> str:
    """The lines of ``text`` (the page converted whole) that make the main content of ``markup``.

    Args:
        markup: The page (its scripts, styles and hidden elements already removed).
        text: The page converted to text, headings as markdown heading lines.

    Returns:
        The main content's lines with their headings, in order; ``text`` itself when no main
        content is found.

    Raises:
        MissingDependencyError: trafilatura is not installed.
    """
    try:
        import trafilatura
    except ImportError as err:
        raise MissingDependencyError("trafilatura", "documents") from err
    found = trafilatura.extract(
        markup,
        output_format="txt",
        include_comments=False,
        include_tables=True,
        include_images=False,
        include_links=False,
        with_metadata=False,
    )
    if not found:
        return text
    main_lines = {_key(line) for line in found.splitlines()}
    main_words = f" {_key(found)} "
    lines = text.split("\n")
    kept = [
        not _HEADING.match(line) and _is_main(_key(line), main_lines, main_words) for line in lines
    ]
    if not any(kept):
        return text
    for idx, line in enumerate(lines):
        heading = _HEADING.match(line)
        if heading is not None:
            kept[idx] = _key(line) in main_lines or _section_kept(lines, kept, idx, heading)
    logger.debug("left out %d line(s) outside the page's main content", len(lines) - sum(kept))
    out: list[str] = []
    for line, keep in zip(lines, kept, strict=True):
        if keep or (not line.strip() and out and out[-1].strip()):  # one blank line between
            out.append(line)
    return "\n".join(out).strip()


def _is_main(key: str, main_lines: set[str], main_words: str) -> bool:
    """Whether a line (as :func:`_key` gives it) is in the main content."""
    if not key:
        return False
    return key in main_lines or (
        key.count(" ") + 1 >= MIN_CONTAINED_WORDS and f" {key} " in main_words
    )


def _section_kept(lines: list[str], kept: list[bool], idx: int, heading: re.Match[str]) -> bool:
    """Whether a line of the heading's section (its subsections included) is kept."""
    level = len(heading.group(1))
    for after in range(idx + 1, len(lines)):
        deeper = _HEADING.match(lines[after])
        if deeper is not None and len(deeper.group(1)) <= level:
            return False
        if deeper is None and kept[after]:
            return True
    return False


def _key(text: str) -> str:
    """Text as compared with the main content: its words, lower case, one space apart."""
    return " ".join(_WORDS.findall(text.casefold()))
