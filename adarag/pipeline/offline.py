"""The offline work ahead of requests: warming chunks, FusionRAG's fused entries, RAGBoost's order.

:func:`warm_chunks` is what ``AdaRAG.warm`` runs: every chunk whose independent KV is not cached
yet is computed once after the system prefix and stored; with ``experimental.fusion`` on, each
chunk's fused entry is computed too. :func:`schedule_requests` is ``AdaRAG.schedule``.

FusionRAG's offline step computes each chunk's KV after its most similar chunks. For every warmed
chunk the retriever is asked with the chunk's own text as the query (the knowledge base's own
embeddings, or BM25 over the warmed chunks when the pipeline has no retriever); the chunk itself
is dropped from the answer and the top ``num_neighbors`` remain, in the retriever's order. The
chunk is then computed in full after the system prefix and those chunks' independent KV
(re-rotated to consecutive positions, reused as is), so its KV holds part of the cross-chunk
attention a prompt with those chunks would give it (FusionRAG section 3.1, Eq. 10). One fused
entry is stored per chunk, keyed by the chunk alone, and a lookup re-rotates it to wherever the
chunk stands.

:class:`ChunkFuser` computes a fused entry (benchmarks use it without a cache);
:class:`FusionWarmer` stores one for every chunk that has none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adarag.cache.tiers import TieredCache
from adarag.config import FusionConfig
from adarag.engine.core import Engine
from adarag.kv import ChunkKV
from adarag.pipeline.context import as_chunks
from adarag.pipeline.prompt import PromptBuilder
from adarag.pipeline.resources import Resources
from adarag.retrievers.base import Retriever
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkFuser:
    """Finds a chunk's most similar chunks and computes its KV after them.

    Args:
        config: How many neighbours.
        engine: The model.
        prompts: Tokenizes chunks as prompts hold them.
        system_kv: The system prefix's KV.
        independent_kv: The independent KV of a chunk's token ids (computed if absent).
    """

    config: FusionConfig
    engine: Engine
    prompts: PromptBuilder
    system_kv: ChunkKV
    independent_kv: Callable[[tuple[int, ...]], ChunkKV]

    def neighbours(self, chunk: Chunk, retriever: Retriever) -> list[tuple[int, ...]]:
        """Token ids of the chunk's most similar chunks, the retriever's best first.

        Only the leading ones that fit in the context before the chunk are kept.
        """
        wanted = self.config.num_neighbors
        own_ids = self.prompts.chunk_ids(chunk.text)
        found: list[tuple[int, ...]] = []
        for other in retriever.retrieve(chunk.text, wanted + 1):
            ids = self.prompts.chunk_ids(other.text)
            if ids != own_ids and ids not in found:
                found.append(ids)
        return self._fitting(own_ids, found[:wanted])

    def _fitting(
        self, chunk_ids: tuple[int, ...], neighbours: list[tuple[int, ...]]
    ) -> list[tuple[int, ...]]:
        room = self.engine.max_context_tokens - len(self.prompts.system_ids) - len(chunk_ids)
        fitting = []
        for ids in neighbours:
            if len(ids) > room:
                break
            room -= len(ids)
            fitting.append(ids)
        if len(fitting) < len(neighbours):
            logger.warning(
                "fusing a chunk after %d of its %d neighbours (the rest exceed the context)",
                len(fitting),
                len(neighbours),
            )
        return fitting

    def fused_kv(
        self, chunk_ids: tuple[int, ...], neighbours: Sequence[tuple[int, ...]]
    ) -> ChunkKV:
        """The chunk's KV after the system prefix and ``neighbours`` (from :meth:`neighbours`)."""
        before = [(ids, self.independent_kv(ids)) for ids in neighbours]
        return self.engine.compute_chunk(self.prompts.system_ids, chunk_ids, self.system_kv, before)


@dataclass(frozen=True)
class FusionWarmer:
    """Computes and stores the fused KV of chunks.

    Args:
        fuser: Finds the neighbours and computes the fused KV.
        cache: Where the independent and fused entries live.
    """

    fuser: ChunkFuser
    cache: TieredCache

    def warm(self, chunks: Sequence[Chunk], retriever: Retriever | None) -> int:
        """Store the fused KV of every chunk that has none; returns how many were computed."""
        finder = retriever if retriever is not None else MemoryRetriever(list(chunks))
        computed = 0
        for chunk in chunks:
            ids = self.fuser.prompts.chunk_ids(chunk.text)
            if self.cache.has_fused(ids):
                continue
            neighbours = self.fuser.neighbours(chunk, finder)
            self.cache.put_fused(ids, self.fuser.fused_kv(ids, neighbours), neighbours)
            computed += 1
        return computed


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
    trailer = resources.trailer_ids
    for chunk in given:
        ids = (*resources.prompts.chunk_ids(chunk.text), *trailer)
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
        [prompts.chunk_ids(chunk.text) for chunk in as_chunks(chunks)] for chunks in requests
    ]
    return resources.cache.plan(chunk_ids)  # the tiers' lock guards the context index
