"""The engine with the real SmolLM2-135M-Instruct against transformers, on real QA passages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adarag.schema import GenerationParams
from tests.tiny_models import load_hf_model
from tests.unit.engine.helpers import independent_sources, layout_of, load_generator

pytestmark = pytest.mark.integration
DATA = Path(__file__).resolve().parents[1] / "data" / "musique_sample.jsonl"


@pytest.fixture(scope="module")
def generator(real_config):
    return load_generator(real_config)


@pytest.fixture(scope="module")
def hf_model(generator):
    return load_hf_model(generator.checkpoint.path)


@pytest.fixture(scope="module")
def layout(generator):
    record = json.loads(DATA.read_text().splitlines()[0])
    return layout_of(generator, record["question"], [p["text"] for p in record["passages"][:2]])


def test_real_model_full_prefill_matches_hf(generator, hf_model, layout):
    output = generator.prefill(layout)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([layout.token_ids])).logits[0, -1]
    torch.testing.assert_close(output.logits, reference, atol=2e-4, rtol=1e-4)


def test_real_model_greedy_decode_matches_hf_generate(generator, hf_model, layout):
    params = GenerationParams(max_new_tokens=32)
    output = generator.prefill(layout, max_new_tokens=32)
    ours = list(generator.decode_tokens(layout, output, params))
    with torch.inference_mode():
        generated = hf_model.generate(
            torch.tensor([layout.token_ids]), max_new_tokens=32, do_sample=False
        )
    reference = generated[0, layout.num_tokens :].tolist()
    assert len(ours) > 0
    assert ours == reference[: len(ours)]


def test_real_model_ratio_one_matches_full_prefill(generator, layout):
    full = generator.prefill(layout)
    sources, _, _ = independent_sources(generator, layout, ratio=1.0)
    fused = generator.prefill(layout, sources)
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(fused.kv.k[:, rows], full.kv.k[:, rows], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused.logits, full.logits, atol=1e-4, rtol=1e-4)
