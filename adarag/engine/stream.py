"""The residual stream a :class:`~adarag.engine.runner.Runner` forward carries, and its helpers.

``_Stream`` holds the hidden states of the tokens being computed and what the layer loop records;
the helpers rescale reused chunk KV, read a stream's per-token segment attention and drop the
tokens of unfocused chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from adarag.engine.batch import ForwardBatch
from adarag.engine.kv_cache import KVCache
from adarag.engine.routing import RungTrace
from adarag.engine.selection import RecomputePlan


@dataclass
class _Stream:
    """Residual stream of the tokens being computed, and what the loop records."""

    hidden: torch.Tensor  # [n, hidden_size]
    positions: torch.Tensor  # [n] ascending
    last_hidden: list[torch.Tensor]
    segment_attention: list[torch.Tensor]
    segment_positions: list[torch.Tensor]  # the rows of each segment_attention entry
    candidate_features: torch.Tensor | None = None  # [n_candidates, raw columns], when asked
    scores: torch.Tensor | None = None  # [n_candidates] the rule's scores (the ladder reuses them)
    reused_logits: torch.Tensor | None = None  # [vocab] the query pass's, over the reused KV
    uncertainty: tuple[RungTrace, ...] = ()  # what uncertainty routing did, when it is on


def _rescale_reused(kv: KVCache, batch: ForwardBatch) -> None:
    """APE's rescaling of reused chunk KV: keys divided by the temperature, log(scale) bias.

    Applies to cached segments that are not exact and not computed in full; the rows a fused
    prefill recomputes are overwritten with fresh, unscaled keys and lose the bias as it goes.
    """
    selection = batch.selection
    temperature, scale = selection.context_temperature, selection.context_scale
    if temperature == 1.0 and scale == 1.0:
        return
    reused = [
        segment
        for segment in batch.segments
        if segment.cached is not None and not segment.exact and not segment.is_computed_in_full
    ]
    if not reused:
        return
    if scale != 1.0:
        kv.key_bias = torch.zeros(kv.k.shape[0], kv.capacity, device=kv.k.device)
    for segment in reused:
        rows = slice(segment.start, segment.end)
        if temperature != 1.0:
            kv.k[:, rows] /= temperature
        if kv.key_bias is not None:
            kv.key_bias[:, rows] = math.log(scale)


def _token_attention(stream: _Stream) -> torch.Tensor:
    """[num_layers, num_tokens, num_segments] segment mass of the tokens of the last layer.

    Every layer ran those tokens (a stream only loses tokens as it goes up), with rows in
    ascending position order, as ``stream.positions``.
    """
    final = stream.positions
    layers = [
        mass[torch.isin(positions, final)].float().cpu()
        for mass, positions in zip(stream.segment_attention, stream.segment_positions, strict=True)
    ]
    return torch.stack(layers)


def _drop_unfocused(
    stream: _Stream,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    plan: RecomputePlan,
    focused: frozenset[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the recomputed tokens of cached chunks outside ``focused`` from the stream.

    Chunks are numbered from 0 (segment 1). Returns the kept rows' cos/sin.
    """
    chunk_of = (plan.candidate_segment - 1).tolist()
    is_unfocused = torch.tensor([chunk not in focused for chunk in chunk_of], dtype=torch.bool)
    dropped = plan.candidates[is_unfocused].to(stream.positions.device)
    keep = ~torch.isin(stream.positions, dropped)
    stream.hidden, stream.positions = stream.hidden[keep], stream.positions[keep]
    return cos_sin[0][keep], cos_sin[1][keep]
