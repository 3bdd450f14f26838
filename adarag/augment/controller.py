"""Adaptive context augmentation (AdaCache Algorithm 1), engine-free.

Chunks are added one at a time. For step ``i`` the caller runs a prefill of ``system + c_1..c_i +
query`` (reusing ``c_1..c_{i-1}`` from the hard tier) and hands back plain values: the lens
signals, the first-token margin, optionally the first answer tokens, and its costs. The
controller scores the confidence (and, with an agreement model, the calibrated probability that
this step already gives the static top-k answer) and asks the stop rule; the caller then either
decodes from step ``i``'s KV or keeps ``c_i`` under its hard key and goes on.
"""

from __future__ import annotations

import time

from adarag.augment.agreement import AgreementModel
from adarag.augment.confidence import ConfidenceEstimator
from adarag.augment.evidence import ScoredStep, StepResult
from adarag.augment.stop_rules import StopRule
from adarag.errors import InputError
from adarag.schema import StopReason


class AugmentationController:
    """Scores each step and decides whether to stop (the caller runs the loop).

    Args:
        estimator: Maps lens signals to confidence.
        stop_rule: Decides after each step.
        agreement: Maps a step's scores to P(its answer equals the static top-k answer); None
            leaves the probability out.
    """

    def __init__(
        self,
        estimator: ConfidenceEstimator,
        stop_rule: StopRule,
        agreement: AgreementModel | None = None,
    ) -> None:
        self.estimator = estimator
        self.stop_rule = stop_rule
        self.agreement = agreement

    def score(self, num_chunks: int, result: StepResult) -> ScoredStep:
        """The confidence (and calibrated probability) of the step with ``num_chunks`` chunks."""
        started = time.perf_counter()
        confidence = self.estimator(result.signals)
        probability = (
            None if self.agreement is None else self.agreement(confidence.value, result.margin)
        )
        return ScoredStep(
            num_chunks, result, confidence, time.perf_counter() - started, probability
        )

    def should_stop(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """``"confident"`` or ``"exhausted"`` to decode from ``step``, None to add a chunk.

        Raises:
            InputError: ``max_steps`` is not positive.
        """
        if max_steps < 1:
            raise InputError(f"augmentation needs at least one chunk, got k={max_steps}")
        return self.stop_rule.decide(step, max_steps)
