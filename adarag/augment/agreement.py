"""Calibrated probability that an augmentation step already gives the static top-k answer.

A step's score (the logit-lens confidence, the first-token margin, or their mean) is mapped to
the probability that its answer equals the answer of the static top-k prompt by isotonic
regression fitted on a calibration split (CALM and PCEE calibrate early exit the same way):
a monotone step function, so a higher score never means a lower probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast, get_args

import numpy as np

from adarag.errors import ConfigError

Feature = Literal["confidence", "margin", "mean"]
"""Which score the isotonic map reads."""
FEATURES: tuple[str, ...] = get_args(Feature)


@dataclass(frozen=True)
class IsotonicMap:
    """A non-decreasing piecewise-linear map from score to probability.

    Attributes:
        x: Ascending knots (scores).
        y: Non-decreasing probabilities at the knots, in [0, 1].
    """

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.x or len(self.x) != len(self.y):
            raise ConfigError(f"an isotonic map needs equal, non-empty knots, got {len(self.x)}")
        if any(b < a for a, b in zip(self.x, self.x[1:], strict=False)) or any(
            b < a for a, b in zip(self.y, self.y[1:], strict=False)
        ):
            raise ConfigError("an isotonic map's knots and values must be non-decreasing")

    def __call__(self, score: float) -> float:
        """The probability at ``score`` (clamped to the end values outside the knots)."""
        return float(np.interp(score, self.x, self.y))

    @classmethod
    def fit(cls, scores: Sequence[float], labels: Sequence[float]) -> IsotonicMap:
        """Least-squares isotonic regression of ``labels`` (0/1) on ``scores``.

        Pool adjacent violators: merge neighbouring blocks while a block's mean drops.

        Raises:
            ConfigError: No data, or scores and labels of different lengths.
        """
        if not scores or len(scores) != len(labels):
            raise ConfigError(f"isotonic fit needs paired data, got {len(scores)} scores")
        order = np.argsort(np.asarray(scores, dtype=np.float64), kind="stable")
        xs = np.asarray(scores, dtype=np.float64)[order]
        ys = np.asarray(labels, dtype=np.float64)[order]
        # blocks of (sum of labels, count, last score); merge while a block's mean drops
        sums: list[float] = []
        counts: list[float] = []
        lows: list[float] = []
        highs: list[float] = []
        for x, y in zip(xs, ys, strict=True):
            sums.append(float(y))
            counts.append(1.0)
            lows.append(float(x))
            highs.append(float(x))
            while len(sums) > 1 and sums[-2] / counts[-2] > sums[-1] / counts[-1]:
                total, count, high = sums.pop(), counts.pop(), highs.pop()
                lows.pop()
                sums[-1] += total
                counts[-1] += count
                highs[-1] = high
        knots_x: list[float] = []
        knots_y: list[float] = []
        for low, high, total, count in zip(lows, highs, sums, counts, strict=True):
            mean = total / count
            for x in (low, high) if high > low else (low,):
                if knots_x and x <= knots_x[-1]:
                    continue
                knots_x.append(x)
                knots_y.append(mean)
        return cls(tuple(knots_x), tuple(knots_y))


@dataclass(frozen=True)
class AgreementModel:
    """P(this step's answer equals the static top-k answer) from a step's scores.

    Attributes:
        feature: The score read: the lens confidence, the first-token margin, or their mean.
        probability: The calibrated map from that score.
    """

    feature: Feature
    probability: IsotonicMap

    @classmethod
    def from_knots(
        cls, feature: str, knots: Sequence[float], probabilities: Sequence[float]
    ) -> AgreementModel:
        """The model a profile stores.

        Raises:
            ConfigError: An unknown feature or a malformed map.
        """
        if feature not in FEATURES:
            raise ConfigError(f"agreement feature must be one of {FEATURES}, got {feature!r}")
        return cls(cast(Feature, feature), IsotonicMap(tuple(knots), tuple(probabilities)))

    def __call__(self, confidence: float, margin: float | None) -> float:
        """The calibrated probability of one step."""
        return self.probability(feature_value(self.feature, confidence, margin))


def feature_value(feature: Feature, confidence: float, margin: float | None) -> float:
    """The score ``feature`` names (a missing margin counts as 0)."""
    margin_value = 0.0 if margin is None else margin
    if feature == "confidence":
        return confidence
    if feature == "margin":
        return margin_value
    return (confidence + margin_value) / 2.0


@dataclass(frozen=True)
class StepEvidence:
    """One augmentation step of a calibration question, run without stopping.

    Attributes:
        confidence: The lens confidence.
        margin: The first-token margin.
        is_stable: Whether the answer prefix equals the previous step's.
        agrees: Whether the step's answer equals the static top-k answer (the last step's).
        cost_share: The step's predicted time as a share of the static top-k prefill's.
    """

    confidence: float
    margin: float | None
    is_stable: bool
    agrees: bool
    cost_share: float = 0.0


@dataclass(frozen=True)
class AgreementFit:
    """A calibrated agreement model, its τ for a risk ε, and the held-out check.

    Attributes:
        model: The isotonic map from the feature to P(agreement).
        threshold: The smallest τ whose early stops differ from static top-k at most ε of the
            time on the fitting half; None when no τ is that safe, or when at that τ the
            held-out half's steps would take more than ``max_cost_share`` of static top-k's
            prefill time (every step pays a prefill's fixed cost, so a rule that rarely stops
            is slower than static top-k): stay static.
        risk: ε.
        min_steps: The floor the stop rule used.
        fit_risk: Share of early stops that disagree on the fitting half at τ.
        held_out_risk: The same on the held-out half (None without early stops there).
        held_out_early_share: Share of held-out questions that stop before the last chunk.
        cost_share: Predicted time of the held-out half's steps under the rule at the safe τ,
            as a share of static top-k's prefill time (None without a safe τ).
    """

    model: AgreementModel
    threshold: float | None
    risk: float
    min_steps: int
    fit_risk: float
    held_out_risk: float | None
    held_out_early_share: float
    cost_share: float | None = None


def fit_agreement(
    questions: Sequence[Sequence[StepEvidence]],
    risk: float = 0.05,
    min_steps: int = 2,
    feature: Feature = "confidence",
    max_cost_share: float = 0.9,
) -> AgreementFit:
    """Fit P(agreement) on the even questions, choose τ for ``risk`` there, check on the odd.

    Raises:
        ConfigError: Fewer than two questions, ``risk`` outside [0, 1) or ``max_cost_share``
            outside (0, 1].
    """
    if len(questions) < 2:
        raise ConfigError(f"agreement calibration needs at least 2 questions, got {len(questions)}")
    if not 0.0 <= risk < 1.0:
        raise ConfigError(f"risk (ε) must be in [0, 1), got {risk}")
    if not 0.0 < max_cost_share <= 1.0:
        raise ConfigError(f"max_cost_share must be in (0, 1], got {max_cost_share}")
    fitting, held_out = list(questions[::2]), list(questions[1::2])
    steps = [step for question in fitting for step in question]
    model = AgreementModel(
        feature,
        IsotonicMap.fit(
            [feature_value(feature, s.confidence, s.margin) for s in steps],
            [float(s.agrees) for s in steps],
        ),
    )
    threshold, fit_risk = None, 0.0
    for candidate in sorted(set(model.probability.y)):
        early_risk, _ = _early_stop_risk(fitting, model, candidate, min_steps)
        if early_risk is not None and early_risk <= risk:
            threshold, fit_risk = candidate, early_risk
            break
    if threshold is None:
        return AgreementFit(model, None, risk, min_steps, fit_risk, None, 0.0)
    held_risk, held_share = _early_stop_risk(held_out, model, threshold, min_steps)
    cost_share = sum(
        sum(s.cost_share for s in question[: first_stop(question, model, threshold, min_steps) + 1])
        for question in held_out
    ) / len(held_out)
    kept = threshold if cost_share <= max_cost_share else None
    return AgreementFit(model, kept, risk, min_steps, fit_risk, held_risk, held_share, cost_share)


def first_stop(
    question: Sequence[StepEvidence], model: AgreementModel, threshold: float, min_steps: int
) -> int:
    """The 0-based step :class:`~adarag.augment.stop_rules.AgreementStop` stops at.

    As in serving, a step's answer counts as stable only when the step before it was confident
    too (answers are decoded only at confident steps).
    """
    confident = [model(step.confidence, step.margin) >= threshold for step in question]
    for index, step in enumerate(question):
        if (
            index + 1 >= min_steps
            and index > 0
            and confident[index - 1]
            and confident[index]
            and step.is_stable
        ):
            return index
    return len(question) - 1


def _early_stop_risk(
    questions: Sequence[Sequence[StepEvidence]],
    model: AgreementModel,
    threshold: float,
    min_steps: int,
) -> tuple[float | None, float]:
    """(Share of early stops that disagree, None without any; share of questions stopping early)."""
    early = [
        question[stop].agrees
        for question in questions
        if (stop := first_stop(question, model, threshold, min_steps)) < len(question) - 1
    ]
    if not early:
        return None, 0.0
    return 1.0 - sum(early) / len(early), len(early) / len(questions)
