"""Our layer loop against Hugging Face transformers on tiny random models of each family."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import GenerationParams
from tests.tiny_models import TINY_FAMILIES, load_hf_model
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_full_prefill_logits_and_kv_match_hf(family, tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints[family]))
    hf_model = load_hf_model(tiny_checkpoints[family])
    layout = layout_of(engine, QUESTION, CHUNKS)
    output = engine.prefill(PrefillRequest(layout))
    with torch.inference_mode():
        reference = hf_model(torch.tensor([layout.token_ids]), use_cache=True)
    torch.testing.assert_close(output.logits, reference.logits[0, -1], atol=2e-5, rtol=1e-5)
    for layer_idx, layer in enumerate(reference.past_key_values.layers):
        ours_k = output.kv.k[layer_idx, : layout.num_tokens].transpose(0, 1)
        torch.testing.assert_close(ours_k, layer.keys[0], atol=2e-5, rtol=1e-5)
        ours_v = output.kv.v[layer_idx, : layout.num_tokens].transpose(0, 1)
        torch.testing.assert_close(ours_v, layer.values[0], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama-hd32"])
def test_greedy_decode_matches_hf_generate(family, tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints[family]))
    hf_model = load_hf_model(tiny_checkpoints[family])
    layout = layout_of(engine, QUESTION, CHUNKS[:2])
    params = GenerationParams(max_new_tokens=32)
    ours = list(
        engine.decode_tokens(
            layout, engine.prefill(PrefillRequest(layout, max_new_tokens=32)), params
        )
    )
    with torch.inference_mode():
        generated = hf_model.generate(
            torch.tensor([layout.token_ids]), max_new_tokens=32, do_sample=False
        )
    reference = generated[0, layout.num_tokens :].tolist()
    assert ours == reference[: len(ours)]
    if len(ours) < 32:  # we stop at EOS without yielding it
        assert reference[len(ours)] in engine.eos_token_ids


def test_decoding_the_same_prefill_twice_gives_the_same_tokens(tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints["llama"]))
    layout = layout_of(engine, QUESTION, CHUNKS)
    output = engine.prefill(PrefillRequest(layout, max_new_tokens=16))
    params = GenerationParams(max_new_tokens=16)
    first = list(engine.decode_tokens(layout, output, params))
    assert list(engine.decode_tokens(layout, output, params)) == first
