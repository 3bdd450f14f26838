"""``GET /v1/files`` a page at a time, as OpenAI's list endpoints page.

The query takes ``purpose`` (only documents of that purpose), ``order`` (``desc``, the default:
newest first; or ``asc``), ``limit`` (1 to 10,000, the default) and ``after`` (the id of the
last document of the previous page). The page holds ``data``, ``first_id``, ``last_id`` and
``has_more``; OpenAI's client follows ``after`` by itself when iterating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adarag.serve.documents import DocumentInfo
from adarag.serve.errors import invalid_request

MAX_LIMIT = 10_000
"""The most documents one page holds (and the default, as OpenAI's)."""
ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class FilePageQuery:
    """What a ``GET /v1/files`` asks for (checked by :meth:`of`)."""

    purpose: str | None = None
    order: str = "desc"
    limit: int = MAX_LIMIT
    after: str | None = None

    @classmethod
    def of(
        cls, purpose: str | None, order: str | None, limit: int | None, after: str | None
    ) -> FilePageQuery:
        """The checked query.

        Raises:
            APIError: 400 naming ``order`` or ``limit`` when it is out of range.
        """
        order = order or "desc"
        if order not in ORDERS:
            raise invalid_request(f"order must be 'asc' or 'desc', got {order!r}", "order")
        limit = MAX_LIMIT if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise invalid_request(f"limit must be 1 to {MAX_LIMIT}, got {limit}", "limit")
        return cls(purpose or None, order, limit, after or None)


def file_page(documents: Sequence[DocumentInfo], query: FilePageQuery) -> dict[str, Any]:
    """The page of ``documents`` that ``query`` asks for, as OpenAI's list object.

    Documents are ordered by creation time, then file name and id (so one second's uploads keep
    one order from page to page).

    Raises:
        APIError: 400 naming ``after`` when no listed document has that id.
    """
    chosen = [d for d in documents if query.purpose is None or d.purpose == query.purpose]
    chosen.sort(key=lambda d: (d.created_at, d.filename, d.file_id), reverse=query.order == "desc")
    start = 0
    if query.after is not None:
        ids = [d.file_id for d in chosen]
        if query.after not in ids:
            raise invalid_request(
                f"after: there is no document {query.after!r} in this list (deleted, or of "
                "another purpose); list again without 'after' to start from the first page",
                "after",
            )
        start = ids.index(query.after) + 1
    page = chosen[start : start + query.limit]
    return {
        "object": "list",
        "data": [info.as_openai() for info in page],
        "first_id": page[0].file_id if page else None,
        "last_id": page[-1].file_id if page else None,
        "has_more": start + len(page) < len(chosen),
    }
