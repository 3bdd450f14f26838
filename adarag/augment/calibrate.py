"""Fitting λ, τ and the normalising scales of the augmentation confidence.

Input: for each validation question, every augmentation step ``i = 1..k`` run without stopping,
with its raw lens signals, its cost (prompt tokens processed at that step) and the quality of
the answer decoded from it (a number in [0, 1], e.g. token F1 against the answer decoded from all
k chunks with full recomputation).

Objective. A setting (λ, τ) stops each question at its first step with confidence >= τ (else at
k). Its score is ``mean quality - cost_weight * mean cost``, where the cost of a question is the
tokens processed up to its stop step divided by the tokens of the static top-k prompt. The scales
are the 95th percentiles of the observed mean KL and entropy, so 95% of the signals fall inside
[0, 1] before clipping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adarag.augment.confidence import ConfidenceParams, LensConfidence, LensSignals, mean
from adarag.errors import InputError


@dataclass(frozen=True)
class StepRecord:
    """One augmentation step of a validation question."""

    signals: LensSignals
    num_processed_tokens: int
    quality: float


@dataclass(frozen=True)
class QuestionRecord:
    """All k steps of one validation question, and its static top-k prompt length."""

    steps: tuple[StepRecord, ...]
    num_static_tokens: int


@dataclass(frozen=True)
class OperatingPoint:
    """Mean quality and cost of one (λ, τ) setting, and its mean stop depth."""

    kl_weight: float
    threshold: float
    quality: float
    cost: float
    mean_chunks: float
    score: float


@dataclass(frozen=True)
class CalibrationFit:
    """The chosen setting, its scales, and every point evaluated (the trade-off curve)."""

    chosen: OperatingPoint
    kl_scale: float
    entropy_scale: float
    points: tuple[OperatingPoint, ...]


def fit(
    records: Sequence[QuestionRecord],
    cost_weight: float,
    kl_weights: Sequence[float] = tuple(np.linspace(0.0, 1.0, 11)),
    thresholds: Sequence[float] = tuple(np.linspace(0.0, 1.0, 51)),
) -> CalibrationFit:
    """Grid-search λ and τ for the objective in the module docstring.

    Raises:
        InputError: No records, or a record without steps.
    """
    if not records or any(not record.steps for record in records):
        raise InputError("calibration needs at least one question with at least one step")
    all_steps = [step for record in records for step in record.steps]
    kl_scale = max(float(np.percentile([mean(s.signals.kl) for s in all_steps], 95)), 1e-6)
    entropy_scale = max(float(np.percentile([s.signals.entropy for s in all_steps], 95)), 1e-6)
    points = []
    for kl_weight in kl_weights:
        estimator = LensConfidence(ConfidenceParams(float(kl_weight), kl_scale, entropy_scale))
        confidences = [[estimator(s.signals).value for s in record.steps] for record in records]
        for threshold in thresholds:
            points.append(
                _evaluate(records, confidences, float(kl_weight), float(threshold), cost_weight)
            )
    chosen = max(points, key=lambda point: (point.score, -point.cost))
    return CalibrationFit(chosen, kl_scale, entropy_scale, tuple(points))


def _evaluate(
    records: Sequence[QuestionRecord],
    confidences: list[list[float]],
    kl_weight: float,
    threshold: float,
    cost_weight: float,
) -> OperatingPoint:
    qualities, costs, depths = [], [], []
    for record, values in zip(records, confidences, strict=True):
        stop = next((i for i, c in enumerate(values) if c >= threshold), len(values) - 1)
        qualities.append(record.steps[stop].quality)
        processed = sum(step.num_processed_tokens for step in record.steps[: stop + 1])
        costs.append(processed / max(record.num_static_tokens, 1))
        depths.append(stop + 1)
    quality, cost = float(np.mean(qualities)), float(np.mean(costs))
    return OperatingPoint(
        kl_weight, threshold, quality, cost, float(np.mean(depths)), quality - cost_weight * cost
    )
