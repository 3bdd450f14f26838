"""The gain rule's calibration in a model's profile: stored, read back, absent from old files."""

from __future__ import annotations

import json

import pytest

from adarag.errors import ConfigError
from adarag.profiles import ModelProfile, find_profile, generic_profile
from adarag.profiles.gain import GainCalibration

CALIBRATION = GainCalibration(0.1, "retrieval", 120, ("hotpotqa", "musique"), 3.25, top_k=16)


def test_a_profile_keeps_its_gain_calibration():
    profile = generic_profile("m", "f", 12).with_learned(gain=CALIBRATION)
    again = ModelProfile.from_json(profile.to_json(), "test")
    assert again == profile and again.gain == CALIBRATION
    assert json.loads(profile.to_json())["gain"]["datasets"] == ["hotpotqa", "musique"]


def test_a_profile_without_gain_reads_back_without_it():
    profile = generic_profile("m", "f", 12)
    again = ModelProfile.from_json(profile.to_json(), "test")
    assert again == profile and again.gain is None


def test_a_profile_written_before_the_gain_rule_loads(tmp_path):
    data = json.loads(generic_profile("m", "f", 12).to_json())
    del data["gain"]  # an older profile has no such key
    (tmp_path / "f.json").write_text(json.dumps(data))
    found = find_profile("m", "f", 12, [tmp_path])
    assert found is not None and found.gain is None


@pytest.mark.parametrize(
    ("model", "num_layers"), [("SmolLM2-135M-Instruct", 30), ("Qwen2.5-Coder-0.5B-Instruct", 24)]
)
def test_the_packaged_profiles_carry_a_fitted_gain_threshold(model, num_layers):
    found = find_profile(model, "no-such-fingerprint", num_layers, [])
    assert found is not None and found.gain is not None
    # fitted by `adarag calibrate --depth --gain-records` on calibration questions of three sets
    assert found.gain.num_questions >= 30 and len(found.gain.datasets) == 3
    assert -1.0 <= found.gain.threshold <= 1.0 and found.gain.order in ("gain", "retrieval")


def test_a_broken_gain_calibration_is_a_clear_error():
    data = json.loads(generic_profile("m", "f", 12).with_learned(gain=CALIBRATION).to_json())
    data["gain"]["order"] = "score"
    with pytest.raises(ConfigError, match="not a valid adarag model profile"):
        ModelProfile.from_json(json.dumps(data), "broken.json")
    del data["gain"]["threshold"]
    with pytest.raises(ConfigError, match="not a valid adarag model profile"):
        ModelProfile.from_json(json.dumps(data), "broken.json")
