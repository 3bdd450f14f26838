"""The depth probe's stop rule, its features, and the stop-rule registry."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from adarag.augment import STOP_RULES, FittedStops, LensConfidence, ProbeStop, StepResult
from adarag.augment.confidence import ConfidenceParams, LensSignals
from adarag.augment.controller import AugmentationController
from adarag.augment.probe import SIGNALS, hidden_names, probe_values
from adarag.config import AugmentConfig
from adarag.errors import ConfigError
from adarag.fitted import FittedModel


def _result(hidden=(0.0, 0.0), scores=(0.9, 0.6, 0.5), entropy=1.0) -> StepResult:
    return StepResult(
        LensSignals((0.2, 0.4), entropy), 10, 10, 0.01, 0.001, 0.3, None, None, hidden, scores
    )


def test_probe_values_read_the_step_and_the_scores():
    values = probe_values(_result(hidden=(1.0, -2.0)), num_chunks=2)
    assert [values[name] for name in hidden_names(2)] == [1.0, -2.0]
    assert values["entropy"] == 1.0 and values["mean_kl"] == pytest.approx(0.3)
    assert values["score_ratio"] == pytest.approx(0.6 / 0.9)
    assert values["next_drop"] == pytest.approx(0.1 / 0.9)
    last = probe_values(_result(), num_chunks=3)
    assert last["next_drop"] == 0.0  # no chunk after the last
    bare = probe_values(_result(scores=()), num_chunks=1)
    assert bare["score_ratio"] == 1.0 and bare["next_drop"] == 0.0
    assert set(SIGNALS) <= set(bare)


def _scored(controller: AugmentationController, num_chunks: int, first_hidden: float):
    return controller.score(num_chunks, _result(hidden=(first_hidden, 0.0)))


def test_the_probe_stops_at_the_first_step_it_trusts():
    # P = sigmoid(4 * hidden_0): sure when hidden_0 is large
    model = FittedModel(("hidden_0",), (0.0,), (1.0,), (4.0,), 0.0)
    rule = ProbeStop(model, threshold=0.9, min_steps=2)
    estimator = LensConfidence(ConfidenceParams(0.5, 1.0, 1.0))
    controller = AugmentationController(estimator, rule)
    assert rule.decide(_scored(controller, 1, 5.0), 6) is None  # below the floor
    assert rule.decide(_scored(controller, 2, 0.0), 6) is None  # P = 0.5
    assert rule.decide(_scored(controller, 2, 5.0), 6) == "confident"
    assert rule.decide(_scored(controller, 6, 0.0), 6) == "exhausted"
    assert not rule.wants_answer_prefix(_scored(controller, 2, 5.0))
    wide = FittedModel(("hidden_0", "hidden_7"), (0.0, 0.0), (1.0, 1.0), (1.0, 1.0), 0.0)
    with pytest.raises(ConfigError, match="residual stream"):
        ProbeStop(wide, 0.5).decide(_scored(controller, 2, 1.0), 6)


def test_the_registry_builds_each_rule_or_none_without_its_fit():
    model = FittedModel(("entropy",), (0.0,), (1.0,), (-1.0,), 0.0)
    bare = FittedStops(threshold=0.4)
    assert STOP_RULES["confidence"](None, bare) is not None
    assert STOP_RULES["agreement"](None, bare) is None
    assert STOP_RULES["probe"](None, bare) is None
    fitted = FittedStops(0.4, probe=(model, 0.7, 2))
    rule = STOP_RULES["probe"](3, fitted)
    assert isinstance(rule, ProbeStop) and rule.min_steps == 3 and rule.threshold == 0.7
    names = AugmentConfig.model_fields["stop_rule"].annotation
    assert set(STOP_RULES) == set(get_args(names))  # one factory per configurable name
    assert np.isclose(model.probability({"entropy": 0.0}), 0.5)
