"""Bad requests and bad models fail with errors that name the problem."""

from __future__ import annotations

import json

import pytest

from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import ConfigError, InputError, ModelLoadError
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


@pytest.fixture()
def engine(tiny_checkpoints, tiny_config):
    return load_engine(tiny_config(tiny_checkpoints["llama"]))


@pytest.mark.parametrize("question", ["", "   \n"])
def test_empty_question_is_rejected(engine, question):
    with pytest.raises(InputError, match="question is empty"):
        layout_of(engine, question, CHUNKS)


def test_no_chunks_is_rejected(engine):
    with pytest.raises(InputError, match="no chunks"):
        layout_of(engine, QUESTION, [])


def test_empty_chunk_is_rejected(engine):
    with pytest.raises(InputError, match="chunk 1 is empty"):
        layout_of(engine, QUESTION, ["text", " "])


def test_prompt_longer_than_the_context_is_rejected(engine):
    layout = layout_of(engine, QUESTION, ["the quick brown fox " * 60] * 3)
    with pytest.raises(InputError, match=r"model's context is 512 tokens"):
        engine.prefill(PrefillRequest(layout, max_new_tokens=8))


def test_unknown_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(AdaRagConfig.build(home=tmp_path, engine={"model": str(missing)}))


def test_directory_that_is_not_a_checkpoint_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_engine(AdaRagConfig.build(home=tmp_path, engine={"model": str(tmp_path)}))


def test_checkpoint_without_safetensors_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_engine(AdaRagConfig.build(home=tmp_path, engine={"model": str(tmp_path)}))


def test_unsupported_family_names_the_supported_ones(tmp_path, tiny_checkpoints):
    config = json.loads((tiny_checkpoints["llama"] / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(
        (tiny_checkpoints["llama"] / "model.safetensors").read_bytes()
    )
    with pytest.raises(ModelLoadError, match="'gpt2' is not supported.*llama, mistral, qwen2"):
        load_engine(AdaRagConfig.build(home=tmp_path, engine={"model": str(tmp_path)}))


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_outside_unit_interval_is_rejected(ratio):
    with pytest.raises(ConfigError, match="recompute_ratio"):
        AdaRagConfig.build(cache={"independent": {"recompute_ratio": ratio}})
