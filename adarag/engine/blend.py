"""Token selection for fused prefill: which tokens of each cached chunk are recomputed.

Two policies rank the tokens of every chunk whose KV came from a cache with ratio 0 < ρ < 1, and
each keeps the top ``ceil(ρ · chunk length)`` of its chunk:

- ``cross_attention`` (AdaCache, section 3.1): at the first layer, the share of a token's
  attention that falls on *other chunks* (segments between the system prefix and the query).
  First-layer K/V depend only on token embeddings and positions, so this needs no recomputation
  and is exact.
- ``kv_deviation`` (CacheBlend): after recomputing the layers below the check layer, the squared
  L2 deviation of the token's fresh V from its cached V at the check layer.

Ties break towards the earlier position, so selection is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from adarag.engine.batch import SegmentPlan


def num_to_recompute(num_tokens: int, ratio: float) -> int:
    """Tokens of a chunk to recompute at ``ratio``: ``ceil(ratio * num_tokens)``, at most all."""
    return min(num_tokens, math.ceil(ratio * num_tokens - 1e-9))


def is_candidate(segment: SegmentPlan) -> bool:
    """A segment whose tokens compete for recomputation (cached, 0 < ratio < 1)."""
    return segment.cached is not None and 0.0 < segment.recompute_ratio < 1.0


def split_positions(segments: Sequence[SegmentPlan]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions always recomputed (uncached or ratio 1) and candidate positions, ascending."""
    always: list[torch.Tensor] = []
    candidates: list[torch.Tensor] = []
    for segment in segments:
        span = torch.arange(segment.start, segment.end)
        if segment.is_computed_in_full:
            always.append(span)
        elif is_candidate(segment):
            candidates.append(span)
    empty = torch.empty(0, dtype=torch.int64)
    return (torch.cat(always) if always else empty, torch.cat(candidates) if candidates else empty)


def cross_chunk_ratio(
    segment_mass: torch.Tensor, positions: torch.Tensor, cu_segments: list[int]
) -> torch.Tensor:
    """Share of each token's attention that falls on chunks other than its own.

    Args:
        segment_mass: [num_tokens, num_heads, num_segments] attention mass per key segment.
        positions: [num_tokens] absolute positions of the tokens.
        cu_segments: Segment boundaries; segment 0 is the system prefix and the last segment is
            the query suffix, the rest are chunks.

    Returns:
        [num_tokens] float32 ratios in [0, 1], averaged over heads.
    """
    mass = segment_mass.mean(dim=1)  # [num_tokens, num_segments]
    own_segment = torch.bucketize(positions, torch.tensor(cu_segments[1:]), right=True)
    chunk_mass = mass[:, 1:-1].sum(dim=1)
    own_mass = mass.gather(1, own_segment[:, None]).squeeze(1)
    is_chunk = (own_segment >= 1) & (own_segment < len(cu_segments) - 2)
    return torch.where(is_chunk, chunk_mass - own_mass, chunk_mass).clamp_(0.0, 1.0)


def value_deviation(v_new: torch.Tensor, v_cached: torch.Tensor) -> torch.Tensor:
    """Squared L2 deviation per token: [num_tokens, heads, dim] x2 -> [num_tokens] float32."""
    return (v_new.float() - v_cached.float()).pow(2).sum(dim=(1, 2))


def select_top_per_segment(
    scores: torch.Tensor, positions: torch.Tensor, segments: Sequence[SegmentPlan]
) -> torch.Tensor:
    """Keep the top ``ceil(ρ · n)`` scored candidates of every candidate segment.

    Args:
        scores: [num_candidates] ranking scores, higher is recomputed first.
        positions: [num_candidates] ascending positions of the candidates.
        segments: The batch's segment plans.

    Returns:
        [num_selected] ascending positions.
    """
    chosen: list[torch.Tensor] = []
    for segment in segments:
        if not is_candidate(segment):
            continue
        in_segment = (positions >= segment.start) & (positions < segment.end)
        segment_scores = scores[in_segment]
        count = num_to_recompute(segment.num_tokens, segment.recompute_ratio)
        order = torch.sort(-segment_scores, stable=True).indices[:count]
        chosen.append(positions[in_segment][order])
    if not chosen:
        return torch.empty(0, dtype=torch.int64)
    return torch.sort(torch.cat(chosen)).values
