"""Learned controllers in a model's profile: stored, read back, checked."""

from __future__ import annotations

import json

import pytest

from adarag.errors import ConfigError
from adarag.fitted import FittedModel
from adarag.profiles import ModelProfile, generic_profile
from adarag.profiles.learned import DepthProbe, LadderCalibration


def _model(names=("a", "b")) -> FittedModel:
    width = len(names)
    return FittedModel(tuple(names), (0.1,) * width, (2.0,) * width, (0.5,) * width, -0.25)


def test_a_profile_keeps_its_selector_ladder_and_probe():
    ladder = LadderCalibration(
        0.2,
        (0.4, 1.0),
        (_model(), _model()),
        (0.8, 0.9),
        ((0.5, 0.6), (0.7, 0.8)),
        ((0.82, 0.3), (0.91, 0.5)),
    )
    probe = DepthProbe(_model(("hidden_0", "entropy")), 0.65, 2, (6, 9, 11))
    profile = generic_profile("m", "f", 12).with_learned(
        selector=_model(), ladder=ladder, depth_probe=probe
    )
    again = ModelProfile.from_json(profile.to_json(), "test")
    assert again == profile
    assert again.ladder is not None and again.ladder.thresholds_for(0.85) == (0.7, 0.8)
    plain = ModelProfile.from_json(generic_profile("m", "f", 12).to_json(), "test")
    assert plain.selector is None and plain.ladder is None and plain.depth_probe is None


def test_a_broken_learned_part_is_a_clear_error():
    data = json.loads(generic_profile("m", "f", 12).with_learned(selector=_model()).to_json())
    data["selector"]["weights"] = [1.0]  # one weight for two features
    with pytest.raises(ConfigError, match="not a valid adarag model profile"):
        ModelProfile.from_json(json.dumps(data), "broken.json")
