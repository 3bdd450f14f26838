"""The pipeline starts the backends built on the engine; the engine starts only its own."""

from __future__ import annotations

import pytest

from adarag.config import AdaRagConfig
from adarag.engine.core import Engine
from adarag.errors import ConfigError
from adarag.pipeline.backends import BACKENDS, start_vllm, start_vllm_server


def test_the_engine_refuses_a_backend_it_is_not_given_a_starter_for(tmp_path):
    config = AdaRagConfig.build(home=tmp_path, engine={"backend": "vllm"})
    with pytest.raises(ConfigError, match="adarag.pipeline.backends.load_engine"):
        Engine.load(config.engine, config.kernels, config.home)


def test_the_vllm_backends_are_registered():
    assert dict(BACKENDS) == {"vllm": start_vllm, "vllm-server": start_vllm_server}


def test_a_given_starter_supplies_the_model_and_decoder(tiny_checkpoints, tiny_config):
    config = tiny_config(tiny_checkpoints["llama"], engine={"backend": "vllm"})
    torch_engine = config.engine.model_copy(update={"backend": "torch"})
    reference = Engine.load(torch_engine, config.kernels, config.home)
    started = []

    def start(checkpoint, engine, max_context_tokens, eos_token_ids):
        started.append((checkpoint.name, engine.backend, max_context_tokens, eos_token_ids))
        return reference.model, reference.decoder

    engine = Engine.load(config.engine, config.kernels, config.home, {"vllm": start})
    assert engine.model is reference.model and engine.decoder is reference.decoder
    assert started == [
        (
            reference.checkpoint.name,
            "vllm",
            reference.max_context_tokens,
            reference.eos_token_ids,
        )
    ]
