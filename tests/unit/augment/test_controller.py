"""The stop rule and the controller, table-driven with fixed confidence values."""

from __future__ import annotations

import pytest

from adarag.augment import (
    AgreementStop,
    AugmentationController,
    Confidence,
    ConfidenceParams,
    LensConfidence,
    LensSignals,
    ScoredStep,
    StepResult,
    ThresholdStop,
)
from adarag.errors import ConfigError, InputError


@pytest.mark.parametrize(
    ("confidence", "step", "max_steps", "min_steps", "expected"),
    [
        (0.9, 1, 6, 1, "confident"),
        (0.5, 1, 6, 1, "confident"),  # reaching τ is enough
        (0.49, 1, 6, 1, None),
        (0.49, 6, 6, 1, "exhausted"),
        (0.9, 6, 6, 1, "confident"),  # confident wins over exhausted
        (0.9, 1, 6, 2, None),  # not before min_steps
        (0.9, 2, 6, 2, "confident"),
        (0.0, 1, 1, 1, "exhausted"),
    ],
)
def test_threshold_stop_rule(confidence, step, max_steps, min_steps, expected):
    rule = ThresholdStop(threshold=0.5, min_steps=min_steps)
    scored = ScoredStep(step, _result(step), Confidence(confidence, 0.0, 0.0), 0.0)
    assert rule.decide(scored, max_steps) == expected


@pytest.mark.parametrize(
    ("step", "stable", "probability", "expected"),
    [
        (2, True, 0.9, "confident"),
        (2, False, 0.99, None),  # a changed answer never stops
        (2, True, 0.79, None),  # below τ
        (1, None, 0.99, None),  # under the floor (and no previous answer)
        (4, False, 0.1, "exhausted"),
        (4, True, 0.9, "confident"),
    ],
)
def test_agreement_stop_needs_a_stable_answer_and_a_likely_agreement(
    step, stable, probability, expected
):
    rule = AgreementStop(threshold=0.8, min_steps=2)
    result = StepResult(LensSignals((), 0.0), 10, 1, 0.1, 0.0, 0.5, (1, 2), stable)
    scored = ScoredStep(step, result, Confidence(0.5, 0.0, 0.0), 0.0, probability)
    assert rule.decide(scored, 4) == expected


def test_agreement_stop_without_a_calibrated_probability_is_a_config_error():
    scored = ScoredStep(2, _result(2), Confidence(0.5, 0.0, 0.0), 0.0, None)
    with pytest.raises(ConfigError, match="adarag calibrate"):
        AgreementStop(threshold=0.5).decide(scored, 4)


class _FixedConfidence:
    """An estimator that returns preset confidences, one per step."""

    def __init__(self, values):
        self.values = list(values)

    def __call__(self, signals):
        return Confidence(self.values[int(signals.entropy)], 0.0, 0.0)


def _result(step: int) -> StepResult:
    return StepResult(LensSignals((), float(step - 1)), 10 * step, step, 0.1, 0.001)


def _loop(controller, k):
    """The pipeline's augmentation loop (``pipeline.steps``) without an engine."""
    ran, kept, scored = [], [], []
    for step in range(1, k + 1):
        ran.append(step)
        scored.append(controller.score(step, _result(step)))
        reason = controller.should_stop(scored[-1], k)
        if reason is not None:
            return ran, kept, reason, scored
        kept.append(step)
    raise AssertionError("the stop rule must stop at the last step")


@pytest.mark.parametrize(
    ("confidences", "k", "steps_taken", "reason", "kept"),
    [
        ([0.9, 0.1, 0.1], 3, 1, "confident", []),
        ([0.1, 0.2, 0.8, 0.9], 4, 3, "confident", [1, 2]),
        ([0.1, 0.2, 0.3], 3, 3, "exhausted", [1, 2]),
        ([0.1], 1, 1, "exhausted", []),
    ],
)
def test_controller_stops_steps_when_the_rule_says(confidences, k, steps_taken, reason, kept):
    controller = AugmentationController(_FixedConfidence(confidences), ThresholdStop(0.7))
    ran, keeps, stop_reason, scored = _loop(controller, k)
    assert ran == list(range(1, steps_taken + 1))
    assert stop_reason == reason
    assert scored[-1].num_chunks == steps_taken
    assert keeps == kept
    assert [s.confidence.value for s in scored] == confidences[:steps_taken]


def test_zero_chunks_is_rejected():
    controller = AugmentationController(_FixedConfidence([1.0]), ThresholdStop(0.5))
    with pytest.raises(InputError, match="k=0"):
        controller.should_stop(controller.score(1, _result(1)), 0)


def test_confidence_combines_normalised_kl_and_entropy():
    params = ConfidenceParams(kl_weight=0.25, kl_scale=2.0, entropy_scale=4.0)
    signals = LensSignals(kl=(1.0, 3.0), entropy=1.0)  # mean KL 2.0 -> 1.0; entropy -> 0.25
    combined = LensConfidence(params)(signals)
    assert combined.kl_score == 1.0 and combined.entropy_score == 0.25
    assert combined.value == pytest.approx(1 - (0.25 * 1.0 + 0.75 * 0.25))
    assert LensConfidence(params, "entropy")(signals).value == pytest.approx(0.75)
    assert LensConfidence(params, "kl")(signals).value == pytest.approx(0.0)
    confident = LensConfidence(params)(LensSignals(kl=(0.0,), entropy=0.0))
    assert confident.value == 1.0


@pytest.mark.parametrize("value", [-0.1, 1.1])
def test_threshold_and_weight_outside_unit_interval_are_rejected(value):
    with pytest.raises(ConfigError, match=r"τ\) must be in \[0, 1\]"):
        ThresholdStop(threshold=value)
    with pytest.raises(ConfigError, match=r"λ\) must be in \[0, 1\]"):
        ConfidenceParams(kl_weight=value, kl_scale=1.0, entropy_scale=1.0)
