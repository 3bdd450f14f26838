"""The selection rules: how each scores the candidate tokens of a fused prefill.

A rule is a small object (:class:`SelectionRule`) registered by its
``RecomputeConfig.selection_policy`` name in :data:`SELECTION_RULES`. It says where it scores
(before any layer, or at a *scoring layer* after the layers below have run for every candidate),
what the runner must compute for it, and turns a :class:`ScoringInputs` into one score per
candidate; :meth:`~adarag.engine.selection.RecomputePlan.choose` keeps the best within the budget.

- ``cross_attention`` (AdaCache section 3.1): at the first layer, the share of a token's
  attention that falls on *other chunks*. First-layer K/V depend only on token embeddings and
  positions, so the analysis is exact and costs one layer.
- ``kv_deviation`` (CacheBlend section 4.3): after recomputing the layers below the check layer,
  the squared L2 deviation of a token's fresh V from its cached V there.
- ``query_attention`` (A3, ProphetKV, FusionRAG's online step): the query suffix first runs over
  the re-positioned cached KV; a token's score is the attention the query pays it, averaged over
  heads, query tokens and the chosen layers.
- ``query_deviation``: the V deviation at the check layer times the attention the query suffix
  pays the token (``query_attention``'s pass). It is the first-order change of the query's
  attention output from making the token's V exact, ``a_qj · ||V_j^fresh − V_j^cached||²``,
  the term the ``output_oracle``'s gradient is made of, with what the engine can know.
- ``learned``: a small model fitted per model by ``adarag calibrate --selector`` on the
  positions the ``output_oracle`` chooses for calibration questions, over run-time features of
  each candidate (:mod:`~adarag.engine.token_features`: K/V deviation at the check layer, the
  query's attention in every layer, position in its chunk, chunk order). It is read from the
  model's profile (``ForwardBatch.token_scorer``); without one it scores as ``query_deviation``.
- ``stored_rank`` (Cache-Craft section 3.3): the ranking stored with each cached chunk variant,
  computed when the variant was (its tokens' attention to the chunks before it); no pass is
  needed. Segments without a stored ranking score zero (ties keep the earlier position).
- ``random``: uniform at the same budget (a control).
- ``oracle``: the tokens whose cached K/V deviate most from a full prefill of the same prompt
  (a control that needs that reference; no rule can know it).
- ``output_oracle``: positions scored by the caller (``ForwardBatch.position_scores``) by how
  much recomputing them changes the answer of a full prefill (a control, benchmarks only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol

import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import ForwardBatch, SegmentPlan
from adarag.engine.kv_cache import KVCache
from adarag.engine.selection import RecomputePlan, is_candidate, value_deviation
from adarag.engine.token_features import derive_features, raw_token_features
from adarag.errors import InputError


@dataclass(frozen=True)
class ScoringInputs:
    """What a rule may read when it scores the candidates of one fused prefill.

    Attributes:
        batch: The prompt, its segments and the request's selection settings.
        plan: The candidates (ascending positions, their segments) and the budgets.
        kv: The fused cache: the chunks' KV loaded and, at a scoring layer, the processed tokens'
            fresh K/V written there.
        query_mass: [num_tokens] float32 on the CPU, the attention the query suffix pays each
            position, when the rule or ``chunk_allocation="query"`` needs it; else None.
        query_layer_mass: [2, num_layers, num_tokens] float32 on the CPU, the attention of all
            the query's tokens ([0]) and of its last token ([1]) in every layer, when the rule
            needs it (``needs_layer_attention``) or features are collected.
        fresh_k: [n_candidates, num_kv_heads, head_dim] the candidates' fresh K at the scoring
            layer, re-rotated (rules with a scoring layer only).
        fresh_v: [n_candidates, num_kv_heads, head_dim] their fresh V at the scoring layer
            (rules with a scoring layer only).
        cached_k: [n_candidates, num_kv_heads, head_dim] their cached K at the scoring layer,
            read before the fresh rows were written (rules that read cached values only).
        cached_v: [n_candidates, num_kv_heads, head_dim] their cached V, read alike.
        candidate_mass: Computes [n_candidates, num_heads, num_segments], the attention mass
            each candidate's fresh query pays each key segment at the scoring layer (rules with
            a scoring layer only).
    """

    batch: ForwardBatch
    plan: RecomputePlan
    kv: KVCache
    query_mass: torch.Tensor | None = None
    query_layer_mass: torch.Tensor | None = None
    fresh_k: torch.Tensor | None = None
    fresh_v: torch.Tensor | None = None
    cached_k: torch.Tensor | None = None
    cached_v: torch.Tensor | None = None
    candidate_mass: Callable[[], torch.Tensor] | None = None


class SelectionRule(Protocol):
    """How one rule scores the candidates.

    Attributes:
        needs_query_attention: The query suffix runs over the cached KV first (``query_mass``).
        needs_layer_attention: That pass keeps the query's attention of every layer
            (``query_layer_mass``).
        reads_cached_values: The candidates' cached K and V at the scoring layer are kept for
            it (``cached_k``, ``cached_v``) before the fresh rows overwrite them.
    """

    needs_query_attention: ClassVar[bool]
    needs_layer_attention: ClassVar[bool]
    reads_cached_values: ClassVar[bool]

    def scoring_layer(self, selection: RecomputeConfig) -> int | None:
        """The layer it scores at (every candidate runs the layers below), or None: up front."""
        ...

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] scores in ``plan.candidates`` order, higher recomputed first."""
        ...


class _UpFront:
    """A rule that scores before any layer, from what the runner has already."""

    needs_query_attention: ClassVar[bool] = False
    needs_layer_attention: ClassVar[bool] = False
    reads_cached_values: ClassVar[bool] = False

    def scoring_layer(self, selection: RecomputeConfig) -> int | None:
        """None: up front."""
        return None


class CrossAttention:
    """``cross_attention``: each candidate's first-layer attention share on other chunks."""

    needs_query_attention: ClassVar[bool] = False
    needs_layer_attention: ClassVar[bool] = False
    reads_cached_values: ClassVar[bool] = False

    def scoring_layer(self, selection: RecomputeConfig) -> int | None:
        """The first layer."""
        return 0

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32 shares in [0, 1]."""
        assert inputs.candidate_mass is not None, "cross_attention scores at its layer"
        mass = inputs.candidate_mass()
        return cross_chunk_ratio(mass, inputs.plan.candidates, inputs.batch.cu_segments)


class KVDeviation:
    """``kv_deviation``: each candidate's V deviation at the check layer."""

    needs_query_attention: ClassVar[bool] = False
    needs_layer_attention: ClassVar[bool] = False
    reads_cached_values: ClassVar[bool] = True

    def scoring_layer(self, selection: RecomputeConfig) -> int | None:
        """``selection.deviation_check_layer``."""
        return selection.deviation_check_layer

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32 squared L2 deviations, on the model's device."""
        assert inputs.fresh_v is not None and inputs.cached_v is not None, "V at the check layer"
        return value_deviation(inputs.fresh_v, inputs.cached_v)


class QueryDeviation(KVDeviation):
    """``query_deviation``: the V deviation times the attention the query pays the candidate."""

    needs_query_attention: ClassVar[bool] = True

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32 on the CPU."""
        assert inputs.query_mass is not None, "query_deviation reads the query's attention"
        return super().score(inputs).cpu() * inputs.query_mass[inputs.plan.candidates]


class Learned(QueryDeviation):
    """``learned``: a scorer fitted on the output-aware oracle, over the candidates' features.

    Without a fitted scorer (``ForwardBatch.token_scorer``) it scores as ``query_deviation``.
    """

    needs_layer_attention: ClassVar[bool] = True

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32 logits on the CPU (``query_deviation``'s without a scorer)."""
        scorer = inputs.batch.token_scorer
        if scorer is None:
            return super().score(inputs)
        assert inputs.query_layer_mass is not None, "learned reads the query's layer attention"
        raw = candidate_features(inputs).numpy()
        derived = derive_features(raw, scorer.features, inputs.query_layer_mass.shape[1])
        return torch.from_numpy(scorer.logits(derived)).float()


class QueryAttention(_UpFront):
    """``query_attention``: the attention the query suffix pays each candidate."""

    needs_query_attention: ClassVar[bool] = True

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32 mass on the CPU."""
        assert inputs.query_mass is not None, "query_attention reads the query's attention"
        return inputs.query_mass[inputs.plan.candidates]


class StoredRank(_UpFront):
    """``stored_rank``: the scores stored with each cached chunk variant."""

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32; zero in segments that carry none."""
        return stored_scores(inputs.batch.segments, inputs.plan)


class RandomScores(_UpFront):
    """``random``: uniform scores from the request's seed (a control)."""

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] uniform in [0, 1)."""
        return random_scores(inputs.plan.candidates.numel(), inputs.batch.selection.seed)


class Oracle(_UpFront):
    """``oracle``: the deviation of the cached K/V from a full prefill's (a control)."""

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32.

        Raises:
            InputError: The batch carries no reference KV.
        """
        if inputs.batch.reference_kv is None:
            raise InputError(
                "the 'oracle' selection needs a full prefill of the same prompt as its "
                "reference; pass reference_kv (benchmarks only)"
            )
        return reference_deviation(inputs.kv, inputs.batch.reference_kv, inputs.plan.candidates)


class OutputOracle(_UpFront):
    """``output_oracle``: positions scored by the caller (a control, benchmarks only)."""

    def score(self, inputs: ScoringInputs) -> torch.Tensor:
        """[n_candidates] float32, the caller's scores of the candidates' positions.

        Raises:
            InputError: The batch carries no position scores.
        """
        if inputs.batch.position_scores is None:
            raise InputError(
                "the 'output_oracle' selection recomputes positions scored by the caller; "
                "pass position_scores (adarag.evaluation.output_oracle, benchmarks only)"
            )
        return inputs.batch.position_scores.float().cpu()[inputs.plan.candidates]


SELECTION_RULES: Mapping[str, SelectionRule] = MappingProxyType(
    {
        "cross_attention": CrossAttention(),
        "kv_deviation": KVDeviation(),
        "query_attention": QueryAttention(),
        "query_deviation": QueryDeviation(),
        "learned": Learned(),
        "stored_rank": StoredRank(),
        "random": RandomScores(),
        "oracle": Oracle(),
        "output_oracle": OutputOracle(),
    }
)
"""Every rule by its ``RecomputeConfig.selection_policy`` name."""


def selection_rule(selection: RecomputeConfig) -> SelectionRule:
    """The rule ``selection.selection_policy`` names."""
    rule = SELECTION_RULES.get(selection.selection_policy)
    assert rule is not None, f"unknown selection rule {selection.selection_policy!r}"
    return rule


# --- scores


def candidate_features(inputs: ScoringInputs) -> torch.Tensor:
    """[n_candidates, raw columns] float32: the candidates' run-time features at the check layer.

    See :mod:`~adarag.engine.token_features`; the inputs must come from a scoring layer with the
    cached K/V and the query's attention of every layer.
    """
    assert inputs.fresh_k is not None and inputs.fresh_v is not None, "fresh K/V at the layer"
    assert inputs.cached_k is not None and inputs.cached_v is not None, "cached K/V at the layer"
    assert inputs.query_layer_mass is not None, "the query's attention of every layer"
    plan = inputs.plan
    return raw_token_features(
        fresh_k=inputs.fresh_k,
        fresh_v=inputs.fresh_v,
        cached_k=inputs.cached_k,
        cached_v=inputs.cached_v,
        query_layer_mass=inputs.query_layer_mass,
        positions=plan.candidates,
        segment=plan.candidate_segment,
        offset=plan.candidate_offset,
        lengths=plan.lengths,
        num_chunks=len(plan.lengths) - 2,
    )


def cross_chunk_ratio(
    segment_mass: torch.Tensor, positions: torch.Tensor, cu_segments: list[int]
) -> torch.Tensor:
    """Share of each token's attention that falls on chunks other than its own.

    Args:
        segment_mass: [num_tokens, num_heads, num_segments] attention mass per key segment, on
            any device (averaged over heads there, then copied).
        positions: [num_tokens] absolute positions of the tokens, on the CPU.
        cu_segments: Segment boundaries; segment 0 is the system prefix and the last segment is
            the query suffix, the rest are chunks.

    Returns:
        [num_tokens] float32 ratios in [0, 1], averaged over heads.
    """
    mass = segment_mass.mean(dim=1).cpu()  # [num_tokens, num_segments]
    own_segment = torch.bucketize(positions, torch.tensor(cu_segments[1:]), right=True)
    chunk_mass = mass[:, 1:-1].sum(dim=1)
    own_mass = mass.gather(1, own_segment[:, None]).squeeze(1)
    is_chunk = (own_segment >= 1) & (own_segment < len(cu_segments) - 2)
    return torch.where(is_chunk, chunk_mass - own_mass, chunk_mass).clamp_(0.0, 1.0)


def stored_scores(segments: Sequence[SegmentPlan], plan: RecomputePlan) -> torch.Tensor:
    """Each candidate's score stored with its segment's KV (``stored_rank``), in candidate order.

    A segment that carries no scores scores zero.
    """
    scores = [
        segment.token_scores.float().cpu()
        if segment.token_scores is not None
        else torch.zeros(segment.num_tokens)
        for segment in segments
        if is_candidate(segment)
    ]
    return torch.cat(scores) if scores else torch.empty(0)


def random_scores(num_candidates: int, seed: int) -> torch.Tensor:
    """Uniform scores from a seeded torch.Generator (the ``random`` control)."""
    rng = torch.Generator().manual_seed(seed)
    return torch.rand(num_candidates, generator=rng)


def reference_deviation(
    fused: KVCache, reference: KVCache, positions: torch.Tensor
) -> torch.Tensor:
    """Deviation of the fused (cached) K/V from a full prefill's, per position (``oracle``).

    Each layer's squared K and V errors are divided by that layer's mean squared norm over the
    positions, so no layer with large activations dominates; the result sums over layers.

    Args:
        fused: The cache after loading the chunks' KV.
        reference: A full prefill's KV of the same prompt.
        positions: [n] positions to score.

    Returns:
        [n] float32.
    """
    total = torch.zeros(positions.numel())
    for cached, exact in ((fused.k, reference.k), (fused.v, reference.v)):
        rows = positions.to(cached.device)
        error = (cached[:, rows].float() - exact[:, rows].to(cached.device).float()).pow(2)
        scale = exact[:, rows].float().pow(2).sum(dim=(2, 3)).mean(dim=1).clamp(min=1e-12)
        total += (error.sum(dim=(2, 3)) / scale[:, None]).sum(dim=0).cpu()
    return total
