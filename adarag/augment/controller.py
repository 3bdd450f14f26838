"""Adaptive context augmentation (AdaCache Algorithm 1), engine-free.

The controller adds retrieved chunks one at a time. For step ``i`` the caller runs a prefill of
``system + c_1..c_i + query`` (reusing ``c_1..c_{i-1}`` from the hard tier) and hands back plain
values: the lens signals and its costs. The controller scores the confidence, asks the stop rule,
and either stops (the caller decodes from step ``i``'s KV) or lets the caller keep ``c_i`` under
its hard key and go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


@dataclass(frozen=True)
class AugmentationOutcome:
    """Every step taken and why augmentation stopped."""

    steps: tuple[ScoredStep, ...]
    stop_reason: StopReason

    @property
    def num_chunks(self) -> int:
        """Chunks in the prompt that is decoded from."""
        return self.steps[-1].num_chunks


class AugmentationController:
    """Runs steps until the stop rule says stop.

    Args:
        estimator: Maps lens signals to confidence.
        stop_rule: Decides after each step.
    """

    def __init__(self, estimator: ConfidenceEstimator, stop_rule: StopRule) -> None:
        self.estimator = estimator
        self.stop_rule = stop_rule

    def run(
        self,
        num_chunks: int,
        run_step: Callable[[int], StepResult],
        keep_step: Callable[[int], None],
    ) -> AugmentationOutcome:
        """Augment up to ``num_chunks`` chunks.

        Args:
            num_chunks: k, the retrieved chunks available.
            run_step: Prefill with the first ``i`` chunks; called for i = 1, 2, ...
            keep_step: Called after a step that does not stop (store ``c_i`` under its hard key).

        Raises:
            InputError: ``num_chunks`` is not positive.
        """
        if num_chunks < 1:
            raise InputError(f"augmentation needs at least one chunk, got k={num_chunks}")
        steps: list[ScoredStep] = []
        for step in range(1, num_chunks + 1):
            result = run_step(step)
            started = time.perf_counter()
            confidence = self.estimator(result.signals)
            scoring_s = time.perf_counter() - started
            steps.append(ScoredStep(step, result, confidence, scoring_s))
            reason = self.stop_rule.decide(confidence.value, step, num_chunks)
            if reason is not None:
                return AugmentationOutcome(tuple(steps), reason)
            keep_step(step)
        raise AssertionError("the stop rule must stop at the last step")
