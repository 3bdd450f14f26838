"""The residual stream a forward carries up the layers, and its helpers.

:class:`Stream` holds the hidden states of the tokens being computed and what the layer loop
records; the helpers rescale reused chunk KV, read a stream's attention statistics (per token
and per segment) and drop the tokens of unfocused chunks.
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
class Stream:
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


def rescale_reused(kv: KVCache, batch: ForwardBatch) -> None:
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


def token_attention(stream: Stream) -> torch.Tensor:
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


def drop_unfocused(
    stream: Stream,
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


def segment_attention_table(stream: Stream, batch: ForwardBatch) -> torch.Tensor:
    """Per layer, mean attention mass from each query segment to each key segment.

    Returns [num_layers, num_segments, num_segments] (rows: the attending tokens' segment).
    """
    bounds = torch.tensor(batch.cu_segments[1:])
    num_segments = len(batch.segments)
    layers = []
    for layer_mass, layer_positions in zip(
        stream.segment_attention, stream.segment_positions, strict=True
    ):  # [n_layer_tokens, num_segments]
        positions = layer_positions.cpu()
        owner = torch.bucketize(positions, bounds, right=True)
        table = torch.zeros(num_segments, num_segments)
        table.index_add_(0, owner, layer_mass.cpu())
        counts = torch.bincount(owner, minlength=num_segments).clamp(min=1)
        layers.append(table / counts[:, None])
    return torch.stack(layers)
