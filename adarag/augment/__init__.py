"""Adaptive context augmentation: confidence, stop rules and the controller."""

from __future__ import annotations

from adarag.augment.confidence import (
    Confidence,
    ConfidenceParams,
    LensConfidence,
    LensSignals,
)
from adarag.augment.controller import AugmentationController, ScoredStep, StepResult
from adarag.augment.policies import StopRule, ThresholdStop

__all__ = [
    "AugmentationController",
    "Confidence",
    "ConfidenceParams",
    "LensConfidence",
    "LensSignals",
    "ScoredStep",
    "StepResult",
    "StopRule",
    "ThresholdStop",
]
