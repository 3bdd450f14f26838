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
from adarag.augment.stop_rules import (
    STOP_RULES,
    AgreementStop,
    FittedStops,
    ProbeStop,
    StopRule,
    ThresholdStop,
)

__all__ = [
    "STOP_RULES",
    "AgreementModel",
    "AgreementStop",
    "AugmentationController",
    "Confidence",
    "IsotonicMap",
    "ConfidenceParams",
    "FittedStops",
    "LensConfidence",
    "LensSignals",
    "ProbeStop",
    "ScoredStep",
    "StepResult",
    "StopRule",
    "ThresholdStop",
]
