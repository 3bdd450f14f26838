"""The step-cost model the agreement calibration uses to check that stopping pays."""

from __future__ import annotations

import pytest

from adarag.augment.step_cost import StepCostModel
from adarag.errors import ConfigError


def test_fit_recovers_a_fixed_and_a_per_token_part():
    tokens = [25, 50, 100, 200, 400]
    model = StepCostModel.fit(tokens, [0.4 + 0.002 * n for n in tokens])
    assert model.fixed_s == pytest.approx(0.4) and model.per_token_s == pytest.approx(0.002)
    # a 50-token step costs far more than 50/400 of a 400-token prefill
    assert model.share(50, 400) == pytest.approx(0.5 / 1.2)
    assert model.share(50, 400) > 50 / 400


def test_fit_keeps_both_parts_non_negative():
    decreasing = StepCostModel.fit([10, 20, 30], [0.3, 0.2, 0.1])
    assert decreasing.per_token_s == 0.0 and decreasing.fixed_s == pytest.approx(0.2)
    through_zero = StepCostModel.fit([100, 200, 300], [0.05, 0.25, 0.45])
    assert through_zero.fixed_s == 0.0 and through_zero.per_token_s > 0


def test_without_timings_cost_is_proportional_to_tokens():
    assert StepCostModel.tokens_only().share(50, 400) == pytest.approx(0.125)


def test_one_timed_step_is_not_enough():
    with pytest.raises(ConfigError, match="at least 2 timed steps"):
        StepCostModel.fit([10], [0.1])
