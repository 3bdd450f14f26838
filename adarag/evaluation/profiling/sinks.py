"""Attention-sink profiling (AdaCache section 3.1, Figure 4): measure, analyse, build a profile.

The profiler runs prompts ``[system, c_1..c_k, query]`` with full attention and averages each
layer's attention to chunk granularity. For every chunk ``c_i`` with earlier chunks, its
cross-chunk attention is split into the share on its predecessor ``c_{i-1}`` and on each earlier
chunk. A layer is *sink-dominated* when one earlier chunk (the sink) draws a larger share than the
predecessor, else *predecessor-local*. Runs of layers with one pattern form bands; the first band
boundary is the transition layer. The sink chunk (a position, e.g. the first chunk) joins the
predecessor in later chunks' effective prefix, which the soft tier's key uses.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from adarag.engine.core import Engine
from adarag.engine.prefill_request import Collect, PrefillRequest
from adarag.errors import ConfigError
from adarag.pipeline.prompt import PromptBuilder
from adarag.profiles.model_profile import LayerBand, ModelProfile, Pattern

logger = logging.getLogger(__name__)


def chunk_attention(
    engine: Engine,
    prompts: PromptBuilder,
    questions: Iterable[tuple[str, Sequence[str]]],
    num_chunks: int,
) -> tuple[torch.Tensor, int]:
    """Mean chunk-granularity attention over prompts with exactly ``num_chunks`` chunks each.

    Returns:
        ``([num_layers, num_chunks + 2, num_chunks + 2] mean attention, number of prompts)``.
    """
    total: torch.Tensor | None = None
    count = 0
    for question, chunks in questions:
        if len(chunks) != num_chunks:
            continue
        layout = prompts.layout(question, chunks)
        output = engine.prefill(PrefillRequest(layout, collect=Collect(segment_attention=True)))
        assert output.segment_attention is not None
        total = output.segment_attention if total is None else total + output.segment_attention
        count += 1
        logger.info("profiled prompt %d (%d tokens)", count, layout.num_tokens)
    if total is None:
        raise ValueError(f"no prompt had {num_chunks} chunks to profile")
    return total / count, count


def build_profile(
    engine: Engine, attention: torch.Tensor, num_prompts: int, model_name: str
) -> ModelProfile:
    """Analyse mean chunk attention into a profile of ``engine``'s model."""
    patterns, predecessor, sink, sink_chunk = analyse_chunk_attention(attention)
    bands = bands_of(patterns)
    transition = bands[1].start if len(bands) > 1 else None
    return ModelProfile(
        model=model_name,
        fingerprint=engine.fingerprint,
        num_layers=attention.shape[0],
        transition_layer=transition,
        sink_chunk_idx=sink_chunk,
        bands=bands,
        predecessor_share=tuple(round(x, 4) for x in predecessor),
        sink_share=tuple(round(x, 4) for x in sink),
        num_prompts=num_prompts,
        num_chunks=attention.shape[1] - 2,
        chunk_attention=tuple(
            tuple(tuple(round(float(x), 4) for x in row) for row in layer) for layer in attention
        ),
        weights_fingerprint=engine.checkpoint.weights_fingerprint(),
    )


def analyse_chunk_attention(
    chunk_attention: torch.Tensor,
    min_band_layers: int = 2,
    min_share_of_predecessor: float = 0.75,
    min_concentration: float = 1.25,
) -> tuple[list[Pattern], list[float], list[float], int | None]:
    """Per-layer pattern, predecessor share and sink share, and the sink chunk.

    Only chunks with at least three earlier chunks are read, so that a candidate sink competes
    with other non-predecessor chunks (earlier rows would favour the first chunk by default).
    Shares are of a chunk's cross-chunk attention (to earlier chunks). The candidate sink of a
    layer is the earlier non-predecessor chunk with the largest mean share; the layer is
    sink-dominated when that share is at least ``min_share_of_predecessor`` times the
    predecessor's and ``min_concentration`` times the mean of the other non-predecessor chunks.

    Args:
        chunk_attention: [num_layers, num_segments, num_segments] mean attention mass from query
            segment to key segment, segments ``[system, c_1..c_k, query]`` with k >= 4.
        min_band_layers: Runs shorter than this are merged into their neighbours.
        min_share_of_predecessor: Sink rule, see above.
        min_concentration: Sink rule, see above.

    Returns:
        ``(patterns, predecessor_share, sink_share, sink_chunk_idx)``; the index is 0-based, None
        when no layer is sink-dominated.
    """
    num_layers, num_segments, _ = chunk_attention.shape
    num_chunks = num_segments - 2
    if num_chunks < 4:
        raise ConfigError(f"profiling needs at least 4 chunks per prompt, got {num_chunks}")
    patterns: list[Pattern] = []
    predecessor_share, sink_share, sink_votes = [], [], Counter[int]()
    for layer in range(num_layers):
        pred, sink_idx, candidate, rest_mean = _layer_shares(chunk_attention[layer], num_chunks)
        predecessor_share.append(pred)
        sink_share.append(candidate)
        is_sink = (
            candidate >= min_share_of_predecessor * pred
            and candidate >= min_concentration * rest_mean
        )
        patterns.append("sink" if is_sink else "predecessor")
        if is_sink:
            sink_votes[sink_idx] += 1
    patterns = _smooth(patterns, min_band_layers)
    has_sink = "sink" in patterns and bool(sink_votes)
    sink_chunk = sink_votes.most_common(1)[0][0] if has_sink else None
    return patterns, predecessor_share, sink_share, sink_chunk


def _layer_shares(layer: torch.Tensor, num_chunks: int) -> tuple[float, int, float, float]:
    """One layer's predecessor share, candidate sink (index, share) and the other chunks' mean.

    ``layer``: [num_segments, num_segments] mean attention mass between segments.
    """
    received = torch.zeros(num_chunks - 2)  # share of each non-predecessor candidate
    counts = torch.zeros(num_chunks - 2)
    predecessor, others = [], []
    for row in range(4, num_chunks + 1):  # segment index of c_row, >= 3 earlier chunks
        cross = layer[row, 1:row]
        total = float(cross.sum())
        if total <= 0.0:
            continue
        shares = cross / total
        predecessor.append(float(shares[-1]))
        received[: row - 2] += shares[:-1]
        counts[: row - 2] += 1
        others.append(shares[:-1])
    mean_received = received / counts.clamp(min=1)
    sink_idx = int(mean_received.argmax())
    rest = [float(torch.cat((o[:sink_idx], o[sink_idx + 1 :])).mean()) for o in others]
    pred = sum(predecessor) / max(len(predecessor), 1)
    return pred, sink_idx, float(mean_received[sink_idx]), sum(rest) / max(len(rest), 1)


def bands_of(patterns: list[Pattern]) -> tuple[LayerBand, ...]:
    """Maximal runs of equal patterns."""
    bands: list[LayerBand] = []
    for layer, pattern in enumerate(patterns):
        if bands and bands[-1].pattern == pattern:
            bands[-1] = LayerBand(bands[-1].start, layer + 1, pattern)
        else:
            bands.append(LayerBand(layer, layer + 1, pattern))
    return tuple(bands)


def _smooth(patterns: list[Pattern], min_run: int) -> list[Pattern]:
    """Flip runs shorter than ``min_run`` (not at the ends) to the surrounding pattern."""
    smoothed = list(patterns)
    for band in bands_of(patterns):
        is_inner = band.start > 0 and band.end < len(patterns)
        if is_inner and band.end - band.start < min_run:
            other: Pattern = "predecessor" if band.pattern == "sink" else "sink"
            smoothed[band.start : band.end] = [other] * (band.end - band.start)
    return smoothed
