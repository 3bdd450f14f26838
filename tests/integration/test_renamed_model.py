"""The packaged profile follows the real model's weights, whatever its directory is called."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from adarag import AdaRAG, AdaRagConfig
from adarag.engine.spec import weights_fingerprint
from adarag.profiles import find_profile

pytestmark = pytest.mark.integration


def test_the_packaged_profile_carries_the_provisioned_weights_fingerprint(real_config):
    model = Path(real_config.engine.model)
    packaged = find_profile(model.name, "not-this-one", 30, [])
    assert packaged is not None
    assert packaged.weights_fingerprint == weights_fingerprint(model)


def test_a_renamed_copy_of_the_default_model_keeps_its_packaged_profile(
    real_config, tmp_path, caplog
):
    """Regression: a renamed checkpoint logged "no attention profile for myqwen"."""
    original = Path(real_config.engine.model)
    renamed = tmp_path / "my-assistant"
    renamed.mkdir()
    for file in original.iterdir():
        (renamed / file.name).symlink_to(file)
    config = AdaRagConfig.build(real_config, engine={"model": str(renamed)})
    with caplog.at_level(logging.INFO), AdaRAG(config) as rag:
        profile = rag.profile
        assert rag.engine.checkpoint.name == "my-assistant"
    assert profile.model == "SmolLM2-135M-Instruct" and profile.transition_layer == 3
    assert "no attention profile" not in caplog.text
    assert "my-assistant has the weights of SmolLM2-135M-Instruct" in caplog.text
