"""Inputs and outputs of one forward step of the runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from adarag.config import RecomputeConfig
from adarag.engine.kv_cache import KVCache
from adarag.engine.routing import RoutingLadder, RungTrace
from adarag.fitted import FittedModel
from adarag.kv import ChunkKV


@dataclass(frozen=True)
class SegmentPlan:
    """How one prompt segment gets its KV.

    Attributes:
        start: First absolute position of the segment.
        end: One past its last position.
        cached: KV computed earlier (re-positioned to ``start`` if stored elsewhere), or None to
            compute the segment in full.
        recompute_ratio: Fraction of the segment's tokens recomputed when ``cached`` is given.
        token_scores: [num_tokens] float scores stored with the cached KV (higher is recomputed
            first by the ``stored_rank`` rule), or None.
        exact: ``cached`` is this segment's exact KV in this prompt (the system prefix, a hard
            hit), so attention rescaling leaves it alone.
    """

    start: int
    end: int
    cached: ChunkKV | None = None
    recompute_ratio: float = 0.0
    token_scores: torch.Tensor | None = None
    exact: bool = False

    def __post_init__(self) -> None:
        assert 0 <= self.start <= self.end, f"negative segment [{self.start}, {self.end})"
        assert 0.0 <= self.recompute_ratio <= 1.0, f"ratio {self.recompute_ratio}"
        if self.cached is not None:
            assert self.cached.num_tokens == self.end - self.start, (
                f"cached KV has {self.cached.num_tokens} tokens, segment {self.end - self.start}"
            )
        if self.token_scores is not None:
            assert self.token_scores.shape == (self.end - self.start,), "one score per token"

    @property
    def num_tokens(self) -> int:
        """Tokens in the segment."""
        return self.end - self.start

    @property
    def is_computed_in_full(self) -> bool:
        """Every token of the segment runs through every layer."""
        return self.cached is None or self.recompute_ratio >= 1.0


@dataclass(frozen=True)
class ForwardBatch:
    """One prompt to prefill: its tokens (at positions 0..n-1) and per-segment plans.

    Attributes:
        token_ids: [num_tokens] int64.
        segments: Plans covering ``0..num_tokens`` in order, without gaps.
        extra_capacity: Free KV rows reserved after the prompt for decoding.
        collect_segment_attention: Also return chunk-granularity attention per layer.
        num_lens_layers: Project the last token after each of this many last layers through the
            final norm and LM head (the logit lens), in the one GEMM that yields the logits.
        selection: How the tokens of cached segments are chosen for recomputation.
        reference_kv: A full prefill of the same prompt, for the ``oracle`` selection only.
        position_scores: [num_tokens] float scores of every position, for the
            ``output_oracle`` selection only.
        resident: A KV cache whose rows ``0..resident_rows`` already hold this prompt's exact
            KV (the previous augmentation step's): the prefill writes into it, loading nothing
            into those rows, when it has room; else a new cache is allocated.
        resident_rows: See ``resident``; the rows must end at a segment boundary.
        token_scorer: The ``learned`` rule's fitted scorer (from the model's profile); None:
            the rule falls back to ``query_deviation``.
        collect_features: Also return the candidates' raw run-time features
            (:mod:`~adarag.engine.token_features`; rules scoring at the check layer only).
        ladder: The routing ladder (:mod:`~adarag.engine.routing`): climb to higher ratios
            while the result is unlikely to agree with full recomputation; None: no routing.
        packet: [m, hidden_size] embeddings of the packet tokens the prompt holds (ids
            ``vocab_size .. vocab_size + m - 1``, :mod:`~adarag.engine.packet`), or None.
    """

    token_ids: torch.Tensor
    segments: tuple[SegmentPlan, ...]
    extra_capacity: int = 0
    collect_segment_attention: bool = False
    num_lens_layers: int = 1
    selection: RecomputeConfig = field(default_factory=RecomputeConfig)
    reference_kv: KVCache | None = None
    position_scores: torch.Tensor | None = None
    resident: KVCache | None = None
    resident_rows: int = 0
    token_scorer: FittedModel | None = None
    collect_features: bool = False
    ladder: RoutingLadder | None = None
    packet: torch.Tensor | None = None

    def __post_init__(self) -> None:
        assert self.segments, "a batch needs at least one segment"
        assert self.segments[0].start == 0, "segments must start at position 0"
        for before, after in zip(self.segments, self.segments[1:], strict=False):
            assert before.end == after.start, f"gap or overlap at {before.end}/{after.start}"
        assert self.segments[-1].end == self.token_ids.numel(), "segments must cover the prompt"
        assert self.num_lens_layers >= 1, "the last layer's logits are always computed"
        assert self.resident_rows == 0 or self.resident_rows in self.cu_segments, (
            "resident rows must end at a segment boundary"
        )

    @property
    def num_tokens(self) -> int:
        """Prompt length."""
        return int(self.token_ids.numel())

    @property
    def cu_segments(self) -> list[int]:
        """Segment boundaries, ``num_segments + 1`` offsets."""
        return [self.segments[0].start, *(segment.end for segment in self.segments)]


@dataclass(frozen=True)
class PrefillOutput:
    """What a prefill returns.

    Attributes:
        kv: The fused KV of the prompt (``kv.length == num_tokens``), with room for decoding.
        logits: [vocab] float32 logits of the last prompt token.
        layer_hidden: [num_layers, hidden_size] last-token residual stream after each layer.
        recomputed_positions: [num_recomputed] int64 positions run through every layer.
        num_processed_tokens: Tokens that went through any layer computation.
        segment_attention: [num_layers, num_segments, num_segments] mean attention mass from
            query segment to key segment, when requested.
        lens_logits: [num_lens_layers, vocab] float32 logit-lens logits of the last token after
            each of the last layers (the last row is ``logits``), when more than one was asked.
        token_attention: [num_layers, n, num_segments] attention mass of each token that ran
            through every layer onto each segment, mean over heads, when segment attention was
            collected.
        token_attention_positions: [n] ascending positions of ``token_attention``'s rows.
        candidate_features: [n_candidates, raw columns] float32 run-time features of the
            candidates (in ascending position order), when the batch asked for them.
        routing: The rungs of the batch's ladder the prefill stood on, the base one first.
    """

    kv: KVCache
    logits: torch.Tensor
    layer_hidden: torch.Tensor
    recomputed_positions: torch.Tensor
    num_processed_tokens: int
    segment_attention: torch.Tensor | None = None
    lens_logits: torch.Tensor | None = None
    token_attention: torch.Tensor | None = None
    token_attention_positions: torch.Tensor | None = None
    candidate_features: torch.Tensor | None = None
    routing: tuple[RungTrace, ...] = ()

    @property
    def num_recomputed_tokens(self) -> int:
        """Tokens run through every layer."""
        return int(self.recomputed_positions.numel())


@dataclass(frozen=True)
class SegmentSource:
    """Where one segment's KV comes from in a fused prefill.

    Attributes:
        cached: KV computed earlier, or None to compute the segment in full.
        recompute_ratio: Fraction of its tokens to recompute when ``cached`` is given.
        token_scores: [num_tokens] scores stored with ``cached`` (the ``stored_rank`` rule).
        exact: ``cached`` is the segment's exact KV in this prompt (system prefix, hard hit).
    """

    cached: ChunkKV | None = None
    recompute_ratio: float = 0.0
    token_scores: torch.Tensor | None = None
    exact: bool = False


def plan_segments(
    cu_segments: list[int], sources: tuple[SegmentSource, ...]
) -> tuple[SegmentPlan, ...]:
    """Segment plans from boundaries and sources (one source per segment)."""
    num_segments = len(cu_segments) - 1
    assert len(sources) == num_segments, f"{len(sources)} sources for {num_segments} segments"
    return tuple(
        SegmentPlan(
            start, end, source.cached, source.recompute_ratio, source.token_scores, source.exact
        )
        for start, end, source in zip(cu_segments, cu_segments[1:], sources, strict=False)
    )
