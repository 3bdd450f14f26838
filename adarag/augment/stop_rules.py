"""Stop rules of adaptive context augmentation: when to stop adding chunks.

A stop rule is a small object (:class:`StopRule`) built by its ``augment.stop_rule`` name from
:data:`STOP_RULES`, given what calibration fitted (:class:`FittedStops`, read from the model's
profile). A factory returns None when the model lacks the rule's calibration: the request then
answers from the static top-k.

- ``confidence``: the logit-lens confidence reaches τ (:class:`ThresholdStop`).
- ``agreement``: the calibrated probability of the static top-k answer reaches τ at two
  consecutive steps with equal first answer tokens (:class:`AgreementStop`).
- ``probe``: the depth probe's probability that no later depth answers better reaches τ
  (:class:`ProbeStop`, :mod:`adarag.augment.probe`).
- ``gain``: the chunks are chosen before the steps, by information gain
  (:mod:`adarag.augment.gain`); over the kept chunks the lens confidence stops
  (:class:`ThresholdStop` at ``experimental.augment.gain_confidence``), or, without it, there
  is no step-wise rule (None: one prefill of the kept chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np

from adarag.augment.agreement import AgreementModel
from adarag.augment.evidence import ScoredStep
from adarag.augment.probe import probe_values, row
from adarag.errors import ConfigError
from adarag.fitted import FittedModel
from adarag.schema import StopReason


class StopRule(Protocol):
    """Decides after each step whether to decode now."""

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """Whether the caller should decode ``step``'s first answer tokens before :meth:`decide`."""
        ...

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """``"confident"`` or ``"exhausted"`` to stop after ``step``, None to go on."""
        ...


def _check_floor(threshold: float, min_steps: int) -> None:
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold (τ) must be in [0, 1], got {threshold}")
    if min_steps < 1:
        raise ConfigError(f"min_steps must be at least 1, got {min_steps}")


@dataclass(frozen=True)
class ThresholdStop:
    """Stop at the first step whose lens confidence reaches τ, or after the last chunk.

    Args:
        threshold: τ in [0, 1].
        min_steps: Never stop on confidence before this many chunks are in the prompt.
    """

    threshold: float
    min_steps: int = 1

    def __post_init__(self) -> None:
        _check_floor(self.threshold, self.min_steps)

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """Never: the confidence alone decides."""
        return False

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step.num_chunks >= self.min_steps and step.confidence.value >= self.threshold:
            return "confident"
        return "exhausted" if step.num_chunks >= max_steps else None


@dataclass(frozen=True)
class AgreementStop:
    """Stop when two signals agree: the answer is stable and its agreement is likely.

    A step stops when at least ``min_steps`` chunks are in the prompt, its calibrated probability
    of giving the static top-k answer reaches τ (chosen for a risk ε by calibration), and its
    first answer tokens equal the previous step's (TASR's answer stability); else after the last
    chunk. Answer tokens are decoded only at steps whose probability reaches τ, so a stop needs two
    consecutive confident steps with the same answer, and unconfident steps decode nothing.

    Args:
        threshold: τ on the calibrated probability, in [0, 1].
        min_steps: The floor on the chunks in the prompt (stability needs at least 2).
    """

    threshold: float
    min_steps: int = 2

    def __post_init__(self) -> None:
        _check_floor(self.threshold, self.min_steps)

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """At confident steps from one before the floor (whose answer the floor step compares)."""
        return (
            step.probability is not None
            and step.num_chunks >= self.min_steps - 1
            and step.probability >= self.threshold
        )

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step.probability is None:
            raise ConfigError(
                "the agreement stop rule needs a calibrated agreement model; run "
                "`adarag calibrate` for this model or set augment.stop_rule='confidence'"
            )
        if (
            step.num_chunks >= self.min_steps
            and step.result.is_stable
            and step.probability >= self.threshold
        ):
            return "confident"
        return "exhausted" if step.num_chunks >= max_steps else None


@dataclass(frozen=True)
class ProbeStop:
    """Stop at the first step whose depth-probe probability reaches τ, or after the last chunk.

    Args:
        model: P(no later depth answers better) over the step's features
            (:func:`~adarag.augment.probe.probe_values`).
        threshold: τ in [0, 1].
        min_steps: Never stop before this many chunks.
    """

    model: FittedModel
    threshold: float
    min_steps: int = 1

    def __post_init__(self) -> None:
        _check_floor(self.threshold, self.min_steps)

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """Never: the probe reads what the prefill computed."""
        return False

    def probability(self, step: ScoredStep) -> float:
        """The probe's probability at ``step``.

        Raises:
            ConfigError: The step carries no residual stream where the probe reads one.
        """
        values = probe_values(step.result, step.num_chunks)
        missing = [name for name in self.model.features if name not in values]
        if missing:
            raise ConfigError(
                f"the depth probe reads {len(missing)} features the step lacks (e.g. "
                f"{missing[0]}); the pipeline hands over the residual stream at the probe's layers"
            )
        return float(self.model.probabilities(np.array([row(values, self.model.features)]))[0])

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step.num_chunks >= self.min_steps and self.probability(step) >= self.threshold:
            return "confident"
        return "exhausted" if step.num_chunks >= max_steps else None


@dataclass(frozen=True)
class FittedStops:
    """What calibration fitted for the stop rules, as the model's profile holds it.

    Attributes:
        threshold: The confidence τ (the profile's or the config's).
        agreement: The agreement rule's probability model, τ and floor; None: not calibrated.
        probe: The depth probe's model, τ and floor; None: not fitted.
        gain_confidence: The confidence τ over the chunks the gain kept (the config's); None:
            one prefill of them.
    """

    threshold: float
    agreement: tuple[AgreementModel, float, int] | None = None
    probe: tuple[FittedModel, float, int] | None = None
    gain_confidence: float | None = None


StopRuleFactory = Callable[[int | None, FittedStops], "StopRule | None"]
"""``(experimental.augment.min_chunks, fitted) ->`` the rule; None without its calibration."""


def _confidence(min_chunks: int | None, fitted: FittedStops) -> StopRule:
    return ThresholdStop(fitted.threshold, min_chunks or 1)


def _agreement(min_chunks: int | None, fitted: FittedStops) -> StopRule | None:
    if fitted.agreement is None:
        return None
    _, threshold, min_steps = fitted.agreement
    return AgreementStop(threshold, min_chunks or min_steps)


def _probe(min_chunks: int | None, fitted: FittedStops) -> StopRule | None:
    if fitted.probe is None:
        return None
    model, threshold, min_steps = fitted.probe
    return ProbeStop(model, threshold, min_chunks or min_steps)


def _gain(min_chunks: int | None, fitted: FittedStops) -> StopRule | None:
    if fitted.gain_confidence is None:
        return None
    return ThresholdStop(fitted.gain_confidence, min_chunks or 1)


STOP_RULES: Mapping[str, StopRuleFactory] = MappingProxyType(
    {"confidence": _confidence, "agreement": _agreement, "probe": _probe, "gain": _gain}
)
"""Every stop rule's factory by its ``augment.stop_rule`` name."""


def build_stop_rule(name: str, min_chunks: int | None, fitted: FittedStops) -> StopRule | None:
    """The stop rule ``name`` from its :data:`STOP_RULES` factory; None without its fit."""
    return STOP_RULES[name](min_chunks, fitted)
