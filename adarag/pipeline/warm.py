"""Warming: the chunks' independent KV (and with ``experimental.fusion`` their fused KV) ahead.

:func:`warm_chunks` is what ``AdaRAG.warm`` runs: every chunk whose independent KV is not cached
yet is computed once after the system prefix and stored; with FusionRAG on, each chunk's fused
entry is computed too (see :mod:`adarag.pipeline.fusion_warm`).
"""

from __future__ import annotations

from collections.abc import Sequence

from adarag.pipeline.context import as_chunks
from adarag.pipeline.fusion_warm import ChunkFuser, FusionWarmer
from adarag.pipeline.resources import Resources
from adarag.retrievers.base import Retriever
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk


def warm_chunks(
    resources: Resources, retriever: Retriever | None, chunks: Sequence[Chunk | str]
) -> int:
    """Precompute the KV of chunks not cached yet; returns how many were new.

    Args:
        resources: The pipeline's engine, cache and prompt builder.
        retriever: Where FusionRAG finds each chunk's most similar chunks; among ``chunks``
            when None.
        chunks: The chunks to warm.

    Returns:
        How many chunks had an entry computed (independent or fused).
    """
    system_kv = resources.system_kv()
    given = as_chunks(chunks)
    new = set()
    for chunk in given:
        ids = resources.prompts.chunk_ids(chunk.text)
        if not resources.cache.has_independent(ids):
            resources.independent_kv(ids)
            new.add(chunk.text)
    config = resources.config.experimental.fusion
    if config.enabled and given:
        fuser = ChunkFuser(
            config, resources.engine, resources.prompts, system_kv, resources.independent_kv
        )
        warmer = FusionWarmer(fuser, resources.cache)
        finder = retriever or MemoryRetriever(given)
        with resources.engine_lock:
            for chunk in given:
                if warmer.warm([chunk], finder):
                    new.add(chunk.text)
    return len(new)
