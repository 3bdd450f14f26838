"""Shared fixtures: seeding, tiny random-weight checkpoints, the real model's config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from adarag.cache import state_lock
from adarag.config import AdaRagConfig
from tests.tiny_models import TINY_FAMILIES, build_tiny_checkpoint

# every change of the tiers' shared state asserts its lock is held (a debug check)
state_lock.CHECK_OWNERSHIP = True


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_config_file_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # the `adarag` command reads $ADARAG_CONFIG: a developer's own must not change what tests run
    monkeypatch.delenv("ADARAG_CONFIG", raising=False)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved HF checkpoint per tiny family (with a tiny tokenizer and chat template)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: build_tiny_checkpoint(name, root / name) for name in TINY_FAMILIES}


@pytest.fixture()
def tiny_config(tmp_path: Path):
    """Config factory for a tiny checkpoint, with its own home directory."""

    def make(checkpoint: Path, **overrides: object) -> AdaRagConfig:
        engine = {"model": str(checkpoint), **overrides.pop("engine", {})}  # type: ignore[dict-item]
        # tiny models have 2 layers: the logit lens reads both
        experimental: dict = dict(overrides.pop("experimental", {}))  # type: ignore[call-overload]
        experimental["augment"] = {"num_lens_layers": 2, **experimental.get("augment", {})}
        return AdaRagConfig.build(
            home=tmp_path / "home", engine=engine, experimental=experimental, **overrides
        )

    return make


@pytest.fixture(scope="session")
def real_config(tmp_path_factory: pytest.TempPathFactory) -> AdaRagConfig:
    """Config of the real default model (SmolLM2-135M-Instruct), provisioned by `make install`.

    In CI a missing model fails; elsewhere the test is skipped.
    """
    from adarag.engine.provision import DEFAULT_MODEL_NAME

    config = AdaRagConfig.build(home=tmp_path_factory.mktemp("real-home"))
    shared_home = AdaRagConfig().home
    model_dir = shared_home / "models" / DEFAULT_MODEL_NAME
    if not (model_dir / "model.safetensors").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the real model is missing at {model_dir}; run `make install`")
        pytest.skip(f"real model not provisioned at {model_dir}")
    return AdaRagConfig.build(config, engine={"model": str(model_dir)})


@pytest.fixture(scope="session")
def vllm_replica(real_config: AdaRagConfig, tmp_path_factory: pytest.TempPathFactory):
    """One ``vllm serve`` replica with adarag's connector, shared by the session's vLLM tests."""
    from tests.vllm_replica import running_replica

    directory = tmp_path_factory.mktemp("vllm_replica")
    with running_replica(real_config, directory, str(directory / "handoff")) as replica:
        yield replica
