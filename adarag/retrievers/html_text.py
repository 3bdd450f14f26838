"""The text of an HTML page, its headings as markdown headings, without markup.

Scripts, styles, templates, embedded objects, form controls, comments and elements marked
``hidden`` are dropped. Each heading (``<h1>`` to ``<h6>``) becomes an ATX heading line (``##
Install``), so the ``markdown`` splitter records heading paths as it does for a markdown file;
list items start with ``- ``, a table row is its cells joined by `` | ``, ``<pre>`` keeps its
lines, and any other text has its whitespace collapsed, one line per block. The walk is
iterative, so a deeply nested page cannot exhaust the stack. Of the converted page, the lines of
its main content are kept (:mod:`adarag.retrievers.main_content`): menus, breadcrumbs, cookie
banners and footers are left out.
"""

from __future__ import annotations

from typing import Any

from adarag.errors import MissingDependencyError
from adarag.retrievers.main_content import main_content

DROPPED = frozenset(
    {
        "script",
        "style",
        "template",
        "noscript",
        "iframe",
        "object",
        "embed",
        "svg",
        "math",
        "canvas",
        "head",
        "input",
        "select",
        "option",
        "textarea",
        "button",
    }
)
BLOCKS = frozenset(
    {
        "address",
        "article",
        "aside",
        "blockquote",
        "body",
        "caption",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "section",
        "summary",
        "table",
        "tbody",
        "thead",
        "tfoot",
        "ul",
    }
)
HEADINGS = {f"h{level}": level for level in range(1, 7)}


def html_to_markdown(markup: str) -> tuple[str | None, str]:
    """``(title, text)`` of an HTML page: its ``<title>`` (None without one) and its main text.

    Raises:
        MissingDependencyError: beautifulsoup4, lxml or trafilatura is not installed.
    """
    try:
        from bs4 import BeautifulSoup
    except ImportError as err:
        raise MissingDependencyError("beautifulsoup4", "documents") from err
    try:
        soup = BeautifulSoup(markup, "lxml")
    except Exception as err:  # bs4.FeatureNotFound: the lxml parser is missing
        raise MissingDependencyError("lxml", "documents") from err
    title_tag = soup.find("title")
    title = _collapsed(title_tag.get_text(" ")) if title_tag is not None else ""
    for tag in soup.find_all(_is_dropped):
        tag.decompose()
    writer = _Writer()
    _walk(soup, writer)
    return title or None, main_content(str(soup), writer.text())


class _Writer:
    """Lines of text: inline pieces gather until a block ends."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.inline: list[str] = []
        self.prefix = ""

    def add(self, text: str) -> None:
        self.inline.append(text)

    def end_block(self) -> None:
        line = _collapsed("".join(self.inline))
        if line:
            self.lines.append(self.prefix + line)
        self.inline.clear()
        self.prefix = ""

    def add_line(self, line: str, *, blank_before: bool = False) -> None:
        self.end_block()
        if blank_before and self.lines:
            self.lines.append("")
        self.lines.append(line)

    def text(self) -> str:
        self.end_block()
        return "\n".join(self.lines).strip()


def _walk(root: Any, writer: _Writer) -> None:
    """Write ``root``'s text, depth first, with an explicit stack."""
    from bs4 import NavigableString, Tag

    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if node is None:  # the end of a block
            writer.end_block()
            continue
        if isinstance(node, NavigableString):
            if type(node) is NavigableString:  # not a comment, doctype or CDATA
                writer.add(str(node))
            continue
        if not isinstance(node, Tag):
            continue
        name = node.name.lower()
        if name in HEADINGS:
            heading = _collapsed(node.get_text(" "))
            if heading:
                writer.add_line(f"{'#' * HEADINGS[name]} {heading}", blank_before=True)
        elif name == "pre":
            writer.add_line(node.get_text().strip("\n"))
        elif name == "tr":
            cells = [
                _collapsed(cell.get_text(" "))
                for cell in node.find_all(["td", "th"], recursive=False)
            ]
            writer.add_line(" | ".join(cell for cell in cells if cell))
        elif name == "br":
            writer.end_block()
        else:
            if name in BLOCKS:
                writer.end_block()
                if name == "li":
                    writer.prefix = "- "
                stack.append(None)
            stack.extend(reversed(node.contents))


def _is_dropped(tag: Any) -> bool:
    """A tag whose content is not text a reader sees: a script, a form control, a hidden one."""
    if tag.name.lower() in DROPPED or tag.has_attr("hidden"):
        return True
    return "display:none" in str(tag.get("style") or "").replace(" ", "").lower()


def _collapsed(text: str) -> str:
    """``text`` with each run of whitespace one space, stripped."""
    return " ".join(text.split())
