"""Confidence of a prefill from logit-lens signals (AdaCache section 3.2).

The engine reports, for the last prompt token, the KL divergence of each of the last ``l - 1``
lens layers' next-token distributions to the final layer's, and the final distribution's
entropy (nats). Both are normalised to [0, 1] with calibrated scales::

    kl_score      = min(mean(kl) / kl_scale, 1)
    entropy_score = min(entropy / entropy_scale, 1)
    uncertainty   = λ · kl_score + (1 - λ) · entropy_score       (combined)
    confidence    = 1 - uncertainty

The estimator is pluggable: entropy only (λ = 0), KL only (λ = 1), or combined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from adarag.errors import ConfigError

Estimator = Literal["combined", "entropy", "kl"]


@dataclass(frozen=True)
class LensSignals:
    """Raw signals of one prefill: per-layer KL to the final layer, and the final entropy."""

    kl: tuple[float, ...]
    entropy: float


@dataclass(frozen=True)
class ConfidenceParams:
    """Calibrated constants of the confidence.

    Attributes:
        kl_weight: λ, the weight of the KL part in the uncertainty.
        kl_scale: Mean KL (nats) that maps to a KL score of 1.
        entropy_scale: Entropy (nats) that maps to an entropy score of 1.
    """

    kl_weight: float
    kl_scale: float
    entropy_scale: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.kl_weight <= 1.0:
            raise ConfigError(f"kl_weight (λ) must be in [0, 1], got {self.kl_weight}")
        if self.kl_scale <= 0.0 or self.entropy_scale <= 0.0:
            raise ConfigError(
                f"normalising scales must be positive, got kl_scale={self.kl_scale}, "
                f"entropy_scale={self.entropy_scale}"
            )


@dataclass(frozen=True)
class Confidence:
    """A confidence and its two normalised parts."""

    value: float
    kl_score: float
    entropy_score: float


class ConfidenceEstimator(Protocol):
    """Maps lens signals to a confidence in [0, 1]."""

    def __call__(self, signals: LensSignals) -> Confidence:
        """The confidence of one prefill."""
        ...


@dataclass(frozen=True)
class LensConfidence:
    """The KL + entropy estimator; ``estimator`` picks combined, entropy-only or KL-only."""

    params: ConfidenceParams
    estimator: Estimator = "combined"

    def __call__(self, signals: LensSignals) -> Confidence:
        """Normalise, weight and invert (see module docstring)."""
        kl_score = normalised(mean(signals.kl), self.params.kl_scale)
        entropy_score = normalised(signals.entropy, self.params.entropy_scale)
        weight = {"combined": self.params.kl_weight, "entropy": 0.0, "kl": 1.0}[self.estimator]
        uncertainty = weight * kl_score + (1.0 - weight) * entropy_score
        return Confidence(1.0 - uncertainty, kl_score, entropy_score)


def normalised(value: float, scale: float) -> float:
    """``value / scale`` clipped to [0, 1]."""
    return min(max(value / scale, 0.0), 1.0)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (0 for no values)."""
    return sum(values) / len(values) if values else 0.0
