"""Adaptive context augmentation: confidence, stop rules and the controller."""

from __future__ import annotations

from adarag.augment.agreement import AgreementModel, IsotonicMap
from adarag.augment.confidence import (
    Confidence,
    ConfidenceParams,
    LensConfidence,
    LensSignals,
)
from adarag.augment.controller import AugmentationController
from adarag.augment.evidence import ScoredStep, StepResult
from adarag.augment.stop_rules import AgreementStop, StopRule, ThresholdStop

__all__ = [
    "AgreementModel",
    "AgreementStop",
    "AugmentationController",
    "Confidence",
    "IsotonicMap",
    "ConfidenceParams",
    "LensConfidence",
    "LensSignals",
    "ScoredStep",
    "StepResult",
    "StopRule",
    "ThresholdStop",
]
