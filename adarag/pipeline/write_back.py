"""A prefill's write-back: each cached segment's fused KV stored under its hard and soft keys.

:class:`WriteBack` is the value a step returns (Algorithm 1, line 18): what to store, not yet
stored. The augmentation loop stores each step but the last before the next one; the answer
stream stores the last one when the answer ends or is closed. :func:`write_back` runs without
the engine lock: the tiers and the store hold their own leaf locks, and the disk and shared-tier
writes it may cause hold up no other request's prefill.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adarag.cache.tiers import TieredCache, TierHit
from adarag.cache.variants import VariantStats, variant_stats
from adarag.engine.batch import PrefillOutput
from adarag.schema import PromptLayout


@dataclass(frozen=True)
class WriteBack:
    """One prefill's segments to store in the cache.

    Attributes:
        cache: Where they go.
        layout: The prompt prefilled.
        output: Its prefill (the fused KV).
        hits: What the tiers found for each cached segment.
        with_variants: Also store Cache-Craft's statistics of each chunk computed in full.
    """

    cache: TieredCache
    layout: PromptLayout
    output: PrefillOutput
    hits: Sequence[TierHit]
    with_variants: bool = False


def write_back(pending: WriteBack) -> None:
    """Store each cached segment under its hard and soft keys (a hard hit's KV is not copied)."""
    layout, output, hits = pending.layout, pending.output, pending.hits
    cu = layout.cu_segments
    segments = layout.cached_segments
    fused = [
        None if hits[i].tier == "hard" else output.kv.segment(cu[i + 1], cu[i + 2])
        for i in range(len(segments))
    ]
    stats = _variant_stats(layout, output, hits) if pending.with_variants else None
    pending.cache.write_back(segments, hits, fused, stats)


def _variant_stats(
    layout: PromptLayout, output: PrefillOutput, hits: Sequence[TierHit]
) -> list[VariantStats | None]:
    """Cache-Craft statistics of each chunk computed in full (None for the others)."""
    attention, rows_at = output.token_attention, output.token_attention_positions
    cu = layout.cu_segments
    lengths = [end - start for start, end in itertools.pairwise(cu)]
    stats: list[VariantStats | None] = []
    for idx, hit in enumerate(hits):
        if hit.tier != "miss" or attention is None or rows_at is None:
            stats.append(None)
            continue
        positions = torch.arange(cu[idx + 1], cu[idx + 2])
        rows = torch.searchsorted(rows_at, positions)
        stats.append(variant_stats(attention[:, rows], idx + 1, lengths))
    return stats
