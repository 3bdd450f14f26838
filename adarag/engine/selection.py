"""Token selection for fused prefill: which tokens of the cached chunks are recomputed.

Every chunk whose KV came from a cache with ratio ``0 < ρ < 1`` is a *candidate* segment; its
tokens compete for recomputation. A fused prefill resolves one :class:`RecomputePlan` from its
segments (always-computed positions, candidates, and each candidate segment's budget
``ceil(ρ · length)``), a rule scores the candidates, and :meth:`RecomputePlan.choose` keeps the
best within the budget. The rules (``RecomputeConfig.selection_policy``, chosen per request) are
the objects of :data:`~adarag.engine.selection_rules.SELECTION_RULES`, described there.

Budgets: ``per_chunk`` keeps the top ``ceil(ρ · n)`` of each candidate segment; ``global`` keeps
the top of all candidates together (the same total), so the chunks the rule ranks higher get
more, with at most ``max_chunk_ratio`` of any one chunk. Ties break towards the earlier position,
so selection is deterministic. Levers on top of any rule (``RecomputeConfig``):

- ``span_tokens``: windows of ``w`` tokens around the best-scored tokens are recomputed
  instead of isolated tokens (:meth:`RecomputePlan.windowed`; CacheClip's grouped windows).
- ``chunk_start_tokens``: the first ``s`` tokens of every candidate chunk are always chosen,
  inside its budget (EPIC's LegoLink).
- ``chunk_allocation="query"``: the total is shared out between chunks in proportion to the
  attention the query pays each (two-stage selection, ProphetKV), then each chunk keeps its best.
- ``uncertain_entropy``: the query suffix runs over the reused KV first; when its next-token
  distribution's entropy (:func:`~adarag.kernels.lens_signals_from_logits`) is above the
  threshold, :meth:`RecomputePlan.raised` lifts every candidate chunk to ``uncertain_ratio``
  (uncertainty routing).
- ``layer_schedule="gradual"``: :func:`layer_budget_factor` scales the budget per layer, more
  tokens low, fewer high (CacheBlend's gradual filtering); the runner narrows the set by V
  deviation as it goes up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import SegmentPlan


def num_to_recompute(num_tokens: int, ratio: float) -> int:
    """Tokens of a chunk to recompute at ``ratio``: ``ceil(ratio * num_tokens)``, at most all."""
    return min(num_tokens, math.ceil(ratio * num_tokens - 1e-9))


def layer_budget_factor(layer: int, num_layers: int, selection: RecomputeConfig) -> float:
    """Share of the budget recomputed at ``layer``: 1 when flat, linear when gradual.

    The gradual schedule goes from ``1 + spread`` at layer 0 to ``1 - spread`` at the last
    layer, so its mean over the layers is 1 (the ratio's own cost).
    """
    if selection.layer_schedule == "flat" or num_layers < 2:
        return 1.0
    return 1.0 + selection.layer_spread * (1.0 - 2.0 * layer / (num_layers - 1))


def allocate(total: int, weights: Sequence[float], caps: Sequence[int]) -> list[int]:
    """Split ``total`` tokens between segments in proportion to ``weights``, each at most its cap.

    Largest remainders round the shares; what a capped segment cannot take goes to the others
    in proportion to their weights. Zero or negative weights share equally.
    """
    share = [max(float(w), 0.0) for w in weights]
    if sum(share) <= 0.0:
        share = [1.0] * len(weights)
    counts = [0] * len(weights)
    left = min(total, sum(caps))
    while left > 0:
        open_ = [i for i in range(len(counts)) if counts[i] < caps[i] and share[i] > 0.0]
        if not open_:
            open_ = [i for i in range(len(counts)) if counts[i] < caps[i]]
            share = [1.0] * len(weights)
        weight = sum(share[i] for i in open_)
        raw = {i: left * share[i] / weight for i in open_}
        given = {i: min(int(raw[i]), caps[i] - counts[i]) for i in open_}
        rest = left - sum(given.values())
        for i in sorted(open_, key=lambda i: (-(raw[i] - int(raw[i])), i)):
            if rest == 0:
                break
            if counts[i] + given[i] < caps[i]:
                given[i] += 1
                rest -= 1
        for i, count in given.items():
            counts[i] += count
        if sum(given.values()) == 0:
            break
        left = min(total, sum(caps)) - sum(counts)
    return counts


def is_candidate(segment: SegmentPlan) -> bool:
    """A segment whose tokens compete for recomputation (cached, 0 < ratio < 1)."""
    return segment.cached is not None and 0.0 < segment.recompute_ratio < 1.0


@dataclass(frozen=True)
class RecomputePlan:
    """The positions of one fused prefill, resolved once from its segment plans.

    Attributes:
        always: [n_always] ascending positions computed in full (uncached segments, ratio 1,
            the query suffix).
        candidates: [n_candidates] ascending positions of candidate segments.
        processed: [n_processed] ascending union of both, the tokens run through layer 0.
        candidate_segment: [n_candidates] index of each candidate's segment in ``segments``.
        candidate_offset: [n_candidates] each candidate's offset inside its segment.
        budgets: Per segment, the tokens it recomputes if it is a candidate (0 otherwise).
        ratios: Per segment, its recomputation ratio if it is a candidate (0 otherwise).
        lengths: Per segment, its number of tokens.
        query: [n_query] positions of the last segment (the query suffix).
    """

    always: torch.Tensor
    candidates: torch.Tensor
    processed: torch.Tensor
    candidate_segment: torch.Tensor
    candidate_offset: torch.Tensor
    budgets: tuple[int, ...]
    ratios: tuple[float, ...]
    lengths: tuple[int, ...]
    query: torch.Tensor

    @classmethod
    def of(cls, segments: Sequence[SegmentPlan]) -> RecomputePlan:
        """Resolve the plan of a batch's segments (positions on the CPU)."""
        always: list[torch.Tensor] = []
        candidates: list[torch.Tensor] = []
        owners: list[torch.Tensor] = []
        budgets = []
        for idx, segment in enumerate(segments):
            span = torch.arange(segment.start, segment.end)
            if segment.is_computed_in_full:
                always.append(span)
            elif is_candidate(segment):
                candidates.append(span)
                owners.append(torch.full_like(span, idx))
            count = is_candidate(segment) and num_to_recompute(
                segment.num_tokens, segment.recompute_ratio
            )
            budgets.append(int(count))
        empty = torch.empty(0, dtype=torch.int64)
        always_t = torch.cat(always) if always else empty
        candidates_t = torch.cat(candidates) if candidates else empty
        owner_t = torch.cat(owners) if owners else empty
        starts = torch.tensor([segment.start for segment in segments])
        return cls(
            always=always_t,
            candidates=candidates_t,
            processed=torch.cat((always_t, candidates_t)).sort().values,
            candidate_segment=owner_t,
            candidate_offset=candidates_t - starts[owner_t] if owners else empty,
            budgets=tuple(budgets),
            ratios=tuple(
                segment.recompute_ratio if is_candidate(segment) else 0.0 for segment in segments
            ),
            lengths=tuple(segment.num_tokens for segment in segments),
            query=torch.arange(segments[-1].start, segments[-1].end),
        )

    def raised(self, ratio: float) -> RecomputePlan:
        """The plan with every candidate segment at ``ratio`` at least (its own if higher)."""
        ratios = tuple(max(own, ratio) if own > 0.0 else 0.0 for own in self.ratios)
        budgets = tuple(
            num_to_recompute(length, own) if own > 0.0 else 0
            for length, own in zip(self.lengths, ratios, strict=True)
        )
        return replace(self, ratios=ratios, budgets=budgets)

    @property
    def has_candidates(self) -> bool:
        """Whether any token competes for recomputation."""
        return self.candidates.numel() > 0

    def candidate_mask(self) -> torch.Tensor:
        """[n_processed] bool: which processed positions are candidates."""
        return torch.isin(self.processed, self.candidates)

    def scaled_budgets(self, factor: float) -> tuple[int, ...]:
        """Per segment, its budget at ``factor`` times its ratio (at most all its tokens)."""
        if factor == 1.0:
            return self.budgets
        return tuple(
            num_to_recompute(length, min(1.0, ratio * factor)) if ratio > 0.0 else 0
            for length, ratio in zip(self.lengths, self.ratios, strict=True)
        )

    def forced(self, selection: RecomputeConfig) -> torch.Tensor:
        """[n_candidates] bool: candidates every selection keeps (each chunk's first tokens)."""
        return self.candidate_offset < selection.chunk_start_tokens

    def choose(
        self,
        scores: torch.Tensor,
        selection: RecomputeConfig,
        *,
        budget_factor: float = 1.0,
        segment_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The candidates to recompute, given their scores (higher first).

        Args:
            scores: [n_candidates] float, in ``candidates`` order.
            selection: The budget mode and cap, and the chunk-start lever.
            budget_factor: Multiplies every segment's ratio (the gradual layer schedule).
            segment_weights: [num_segments] weights that share the total budget out between
                candidate segments (``chunk_allocation="query"``); None: the budget mode.

        Returns:
            [n_chosen] ascending positions.
        """
        assert scores.shape == self.candidates.shape, f"{scores.shape} scores for candidates"
        scores = scores.detach().float().cpu().clone()
        if selection.span_tokens > 1:
            scores = self.windowed(scores, selection.span_tokens)
        scores[self.forced(selection)] = math.inf
        budgets = self.scaled_budgets(budget_factor)
        if segment_weights is not None:
            segments = [idx for idx, ratio in enumerate(self.ratios) if ratio > 0.0]
            shares = allocate(
                sum(budgets),
                [float(segment_weights[idx]) for idx in segments],
                [self.lengths[idx] for idx in segments],
            )
            per_segment = [0] * len(budgets)
            for idx, count in zip(segments, shares, strict=True):
                per_segment[idx] = count
            return self._top_per_segment(scores, tuple(per_segment))
        if selection.budget == "per_chunk":
            return self._top_per_segment(scores, budgets)
        return self._top_overall(scores, budgets, selection.max_chunk_ratio)

    def windowed(self, scores: torch.Tensor, span: int) -> torch.Tensor:
        """[n_candidates] ranks (higher first) that choose windows of ``span`` tokens.

        A candidate scores the best score of the ``span`` candidates around it in its segment
        (the window of a best token ``i`` is ``i - (span - 1) // 2 .. i + span // 2``); ties go
        to the higher own score, then to the earlier position.
        """
        pooled = scores.clone()
        before, after = span // 2, (span - 1) // 2
        for segment in torch.unique(self.candidate_segment):
            rows = (self.candidate_segment == segment).nonzero().squeeze(1)
            padded = torch.nn.functional.pad(
                scores[rows][None, None], (before, after), value=-math.inf
            )
            pooled[rows] = torch.nn.functional.max_pool1d(padded, span, stride=1)[0, 0]
        by_own = torch.sort(-scores, stable=True).indices  # best first, earlier on ties
        order = by_own[torch.sort(-pooled[by_own], stable=True).indices]
        ranks = torch.empty(scores.numel(), dtype=torch.float32)
        ranks[order] = torch.arange(scores.numel(), 0, -1, dtype=torch.float32)
        return ranks

    def _ranks(self, scores: torch.Tensor) -> torch.Tensor:
        """[n_candidates] rank of each candidate inside its segment, best first."""
        # rank of each candidate inside its segment, best first (stable: earlier first on ties)
        order = torch.sort(-scores, stable=True).indices
        order = order[torch.sort(self.candidate_segment[order], stable=True).indices]
        owner = self.candidate_segment[order]
        first_of_segment = torch.searchsorted(owner, owner, right=False)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel()) - first_of_segment
        return rank

    def _top_per_segment(self, scores: torch.Tensor, budgets: tuple[int, ...]) -> torch.Tensor:
        """The best ``budgets[s]`` candidates of every segment ``s``."""
        rank = self._ranks(scores)
        return self.candidates[rank < torch.tensor(budgets)[self.candidate_segment]].sort().values

    def _top_overall(
        self, scores: torch.Tensor, budgets: tuple[int, ...], max_chunk_ratio: float | None
    ) -> torch.Tensor:
        """The best ``sum(budgets)`` candidates of all segments, at most the cap of each."""
        rank = self._ranks(scores)
        per_candidate = torch.tensor(budgets)[self.candidate_segment]
        lengths = torch.tensor(self.lengths)[self.candidate_segment]
        cap = (
            lengths
            if max_chunk_ratio is None
            else torch.ceil(max_chunk_ratio * lengths - 1e-9).long()
        )
        eligible = rank < torch.maximum(cap, per_candidate)
        ranked = torch.sort(torch.where(eligible, -scores, math.inf), stable=True).indices
        return self.candidates[ranked[: sum(budgets)]].sort().values

    def keep_mask(self, chosen: torch.Tensor) -> torch.Tensor:
        """[n_processed] bool: always-computed positions and the chosen candidates."""
        return torch.isin(self.processed, self.always) | torch.isin(self.processed, chosen)


def segment_sums(values: torch.Tensor, cu_segments: Sequence[int]) -> torch.Tensor:
    """[num_segments] sums of per-position ``values [num_tokens]`` over each segment."""
    bounds = torch.tensor(list(cu_segments), dtype=torch.int64)
    totals = torch.cumsum(torch.cat((torch.zeros(1), values.float().cpu())), dim=0)
    return totals[bounds[1:]] - totals[bounds[:-1]]


def value_deviation(v_new: torch.Tensor, v_cached: torch.Tensor) -> torch.Tensor:
    """Squared L2 deviation per token: [num_tokens, heads, dim] x2 -> [num_tokens] float32."""
    return (v_new.float() - v_cached.float()).pow(2).sum(dim=(1, 2))


def key_attention_mass(
    q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention probability each key receives, summed over queries and heads.

    Args:
        q: [num_q, num_heads, head_dim] queries at ``q_positions``.
        k: [num_kv, num_kv_heads, head_dim], row ``j`` at position ``j``.
        q_positions: [num_q] absolute positions (a query sees keys ``j <= p``).
        scale: Softmax scale.

    Returns:
        [num_kv] float32 mass, averaged over heads (each query row sums to one per head).
    """
    num_q, num_heads, head_dim = q.shape
    num_kv, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    # one matmul per KV head over its whole query group: [kv_heads, group * num_q, num_kv]
    grouped = q.reshape(num_q, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    grouped = grouped.reshape(num_kv_heads, group * num_q, head_dim)
    logits = torch.bmm(grouped, k.permute(1, 2, 0)).float() * scale
    visible = torch.arange(num_kv, device=k.device)[None, :] <= q_positions.repeat(group)[:, None]
    probs = logits.masked_fill_(~visible[None], -math.inf).softmax(dim=-1)
    return probs.sum(dim=(0, 1)) / num_heads
