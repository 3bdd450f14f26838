"""Adaptive context augmentation (AdaCache Algorithm 1), engine-free.

Chunks are added one at a time. For step ``i`` the caller runs a prefill of ``system + c_1..c_i +
query`` (reusing ``c_1..c_{i-1}`` from the hard tier) and hands back plain values: the lens
signals and its costs. The controller scores the confidence and asks the stop rule; the caller
then either decodes from step ``i``'s KV or keeps ``c_i`` under its hard key and goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adarag.augment.confidence import Confidence, ConfidenceEstimator, LensSignals
from adarag.augment.policies import StopRule
from adarag.errors import InputError
from adarag.schema import StopReason


@dataclass(frozen=True)
class StepResult:
    """What the caller reports for one step."""

    signals: LensSignals
    num_processed_tokens: int
    num_recomputed_tokens: int
    prefill_s: float
    confidence_s: float


@dataclass(frozen=True)
class ScoredStep:
    """A step and the confidence the controller gave it."""

    num_chunks: int
    result: StepResult
    confidence: Confidence
    scoring_s: float


class AugmentationController:
    """Scores each step and decides whether to stop (the caller runs the loop).

    Args:
        estimator: Maps lens signals to confidence.
        stop_rule: Decides after each step.
    """

    def __init__(self, estimator: ConfidenceEstimator, stop_rule: StopRule) -> None:
        self.estimator = estimator
        self.stop_rule = stop_rule

    def score(self, num_chunks: int, result: StepResult) -> ScoredStep:
        """The confidence of the step with ``num_chunks`` chunks, timed."""
        started = time.perf_counter()
        confidence = self.estimator(result.signals)
        return ScoredStep(num_chunks, result, confidence, time.perf_counter() - started)

    def should_stop(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """``"confident"`` or ``"exhausted"`` to decode from ``step``, None to add a chunk.

        Raises:
            InputError: ``max_steps`` is not positive.
        """
        if max_steps < 1:
            raise InputError(f"augmentation needs at least one chunk, got k={max_steps}")
        return self.stop_rule.decide(step.confidence.value, step.num_chunks, max_steps)
