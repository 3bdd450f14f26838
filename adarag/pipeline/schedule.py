"""RAGBoost's scheduling: the order to run a batch of requests in, prefix-sharing ones together."""

from __future__ import annotations

from collections.abc import Sequence

from adarag.pipeline.resources import Resources
from adarag.schema import Chunk


def schedule_requests(resources: Resources, requests: Sequence[Sequence[Chunk | str]]) -> list[int]:
    """The order to run ``requests`` in (see ``AdaRAG.schedule``).

    Requests that share chunks form groups (largest first), and each group's shared chunks get
    one order, recorded in the hard tier's context index.

    Args:
        resources: The pipeline's prompt builder and cache.
        requests: Each request's chunks in the retriever's order.

    Returns:
        Indices into ``requests`` in the order to run them.
    """
    prompts = resources.prompts
    chunk_ids = [
        [prompts.chunk_ids(c.text if isinstance(c, Chunk) else c) for c in chunks]
        for chunks in requests
    ]
    with resources.engine_lock:  # the context index is shared by concurrent requests
        return resources.cache.plan(chunk_ids)
