"""Fused-prefill sources built by hand, for benchmarks that fix every chunk's tier and ratio.

The pipeline chooses each chunk's KV from the tiers; benchmarks of the engine and of selection
rules instead reuse every chunk's *independent* KV (computed alone after the system prefix, as
ingest does) at one ratio, with the system prefix an exact hit.
"""

from __future__ import annotations

from adarag.engine.batch import SegmentSource
from adarag.engine.core import Engine
from adarag.engine.prefill_request import PrefillRequest
from adarag.kv import ChunkKV
from adarag.schema import PromptLayout


def system_prefix_kv(engine: Engine, layout: PromptLayout) -> ChunkKV:
    """The exact KV of the system prefix (computed as a prompt of its own)."""
    prefix_only = engine.prefill(PrefillRequest(PromptLayout((), (), layout.system_ids)))
    return prefix_only.kv.segment(0, len(layout.system_ids))


def independent_chunks(engine: Engine, layout: PromptLayout) -> tuple[ChunkKV, list[ChunkKV]]:
    """The system prefix's KV and each chunk's independent KV."""
    system_kv = system_prefix_kv(engine, layout)
    system_ids = layout.system_ids
    return system_kv, [engine.compute_chunk(system_ids, ids, system_kv) for ids in layout.chunk_ids]


def reuse_sources(
    system_kv: ChunkKV, chunk_kvs: list[ChunkKV], ratio: float
) -> list[SegmentSource]:
    """Sources: the exact system prefix, every chunk's KV at ``ratio``, the query computed."""
    return [
        SegmentSource(system_kv, exact=True),
        *(SegmentSource(kv, ratio) for kv in chunk_kvs),
        SegmentSource(),
    ]
