"""The calibrated agreement model: isotonic fit, τ for a risk, the held-out check, the profile."""

from __future__ import annotations

import random

import pytest

from adarag.augment.agreement import (
    AgreementModel,
    IsotonicMap,
    StepEvidence,
    first_stop,
    fit_agreement,
)
from adarag.errors import ConfigError
from adarag.profiles import ModelProfile, generic_profile
from adarag.profiles.model_profile import AgreementCalibration, Calibration


def test_isotonic_fit_pools_violators_into_a_monotone_map():
    fitted = IsotonicMap.fit([0.1, 0.2, 0.3, 0.4], [0.0, 1.0, 0.0, 1.0])
    assert fitted(0.1) == 0.0
    assert fitted(0.2) == pytest.approx(0.5) and fitted(0.3) == pytest.approx(0.5)
    assert fitted(0.4) == 1.0
    assert list(fitted.y) == sorted(fitted.y)


def test_isotonic_fit_matches_brute_force_least_squares_on_random_data():
    rng = random.Random(0)
    scores = [rng.random() for _ in range(40)]
    labels = [float(rng.random() < s) for s in scores]
    fitted = IsotonicMap.fit(scores, labels)
    values = [fitted(s) for s in scores]
    order = sorted(range(40), key=lambda i: scores[i])
    assert all(values[a] <= values[b] + 1e-12 for a, b in zip(order, order[1:], strict=False))
    # pooled means: each block's value is the mean of its labels, so residuals sum to zero
    assert sum(values) == pytest.approx(sum(labels))


def test_a_decreasing_map_is_rejected():
    with pytest.raises(ConfigError, match="non-decreasing"):
        IsotonicMap((0.0, 1.0), (0.9, 0.1))


def _question(confidences, stable, agrees, cost_share=0.0):
    return [
        StepEvidence(c, None, s, a, cost_share)
        for c, s, a in zip(confidences, stable, agrees, strict=True)
    ]


def test_a_safe_threshold_that_saves_too_few_tokens_stays_static():
    def questions(share):
        good = _question([0.8, 0.9, 0.9], [False, True, True], [True, True, True], share)
        bad = _question([0.2, 0.6, 0.9], [False, True, True], [False, False, True], share)
        return [good, good, bad, bad] * 5

    cheap = fit_agreement(questions(0.2), risk=0.05, max_cost_share=0.8)
    # held out: half stop at step 2 (0.4 of static's tokens), half run all 3 steps (0.6)
    assert cheap.threshold is not None and cheap.cost_share == pytest.approx(0.5)
    dear = fit_agreement(questions(0.5), risk=0.05, max_cost_share=0.8)
    assert dear.threshold is None and dear.cost_share == pytest.approx(1.25)


def test_risk_picks_the_smallest_safe_threshold_and_reports_the_held_out_half():
    # confident and stable steps agree; middling ones do not: only a high τ is safe
    good = _question([0.8, 0.9, 0.9], [False, True, True], [True, True, True])
    bad = _question([0.2, 0.6, 0.9], [False, True, True], [False, False, True])
    fit = fit_agreement([good, good, bad, bad] * 5, risk=0.05, min_steps=2)
    assert fit.threshold is not None and fit.fit_risk <= 0.05
    assert fit.model(0.9, None) > fit.model(0.6, None)
    assert first_stop(bad, fit.model, fit.threshold, 2) == 2  # never stops on the bad step
    assert first_stop(good, fit.model, fit.threshold, 2) == 1
    assert fit.held_out_risk == 0.0 and fit.held_out_early_share == pytest.approx(0.5)
    loose = fit_agreement([good, good, bad, bad] * 5, risk=0.6, min_steps=2)
    assert loose.threshold is not None and loose.threshold < fit.threshold


def test_a_stop_needs_two_consecutive_confident_steps_with_the_same_answer():
    model = AgreementModel("confidence", IsotonicMap((0.0, 1.0), (0.0, 1.0)))
    late = _question([0.2, 0.9, 0.9, 0.9], [False, True, True, True], [False] * 4)
    # step 2 is stable and confident, but step 1 was not confident: its answer was never decoded
    assert first_stop(late, model, 0.8, 2) == 2
    unstable = _question([0.9, 0.9, 0.9, 0.9], [False, False, True, True], [False] * 4)
    assert first_stop(unstable, model, 0.8, 2) == 2
    assert first_stop(unstable, model, 0.8, 4) == 3  # the floor


def test_no_safe_threshold_means_stay_static():
    bad = _question([0.9, 0.9, 0.9], [False, True, True], [False, False, True])
    fit = fit_agreement([bad] * 6, risk=0.05)
    assert fit.threshold is None and fit.held_out_risk is None


def test_bad_calibration_input_is_rejected():
    with pytest.raises(ConfigError, match="at least 2 questions"):
        fit_agreement([[StepEvidence(0.5, None, True, True)]])
    with pytest.raises(ConfigError, match=r"risk \(ε\)"):
        fit_agreement([[StepEvidence(0.5, None, True, True)]] * 2, risk=1.5)


def test_the_margin_and_mean_features_read_the_margin():
    identity = IsotonicMap((0.0, 1.0), (0.0, 1.0))
    assert AgreementModel("margin", identity)(0.9, 0.2) == pytest.approx(0.2)
    assert AgreementModel("mean", identity)(0.9, 0.1) == pytest.approx(0.5)
    assert AgreementModel("confidence", identity)(0.9, None) == pytest.approx(0.9)


def test_an_agreement_calibration_survives_the_profile_file():
    agreement = AgreementCalibration("confidence", (0.1, 0.8), (0.2, 0.95), 0.9, 0.05, 2, 0.04)
    profile = generic_profile("m", "f", 4).with_calibration(Calibration(agreement=agreement))
    restored = ModelProfile.from_json(profile.to_json(), "test")
    assert restored.calibration.agreement == agreement
