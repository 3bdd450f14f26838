"""The engine with the real SmolLM2-135M-Instruct against transformers, on real QA passages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import GenerationParams
from tests.tiny_models import load_hf_model
from tests.unit.engine.helpers import independent_sources, layout_of, load_engine

pytestmark = pytest.mark.integration
DATA = Path(__file__).resolve().parents[1] / "data" / "musique_sample.jsonl"


@pytest.fixture(scope="module")
def engine(real_config):
    return load_engine(real_config)


@pytest.fixture(scope="module")
def hf_model(engine):
    return load_hf_model(engine.checkpoint.path)


@pytest.fixture(scope="module")
def layout(engine):
    record = json.loads(DATA.read_text().splitlines()[0])
    return layout_of(engine, record["question"], [p["text"] for p in record["passages"][:2]])


def test_real_model_full_prefill_matches_hf(engine, hf_model, layout):
    output = engine.prefill(PrefillRequest(layout))
    with torch.inference_mode():
        reference = hf_model(torch.tensor([layout.token_ids])).logits[0, -1]
    torch.testing.assert_close(output.logits, reference, atol=2e-4, rtol=1e-4)


def test_real_model_greedy_decode_matches_hf_generate(engine, hf_model, layout):
    params = GenerationParams(max_new_tokens=32)
    output = engine.prefill(PrefillRequest(layout, max_new_tokens=32))
    ours = list(engine.decode_tokens(layout, output, params))
    with torch.inference_mode():
        generated = hf_model.generate(
            torch.tensor([layout.token_ids]), max_new_tokens=32, do_sample=False
        )
    reference = generated[0, layout.num_tokens :].tolist()
    assert len(ours) > 0
    assert ours == reference[: len(ours)]


def test_real_model_ratio_one_matches_full_prefill(engine, layout):
    full = engine.prefill(PrefillRequest(layout))
    sources, _, _ = independent_sources(engine, layout, ratio=1.0)
    fused = engine.prefill(PrefillRequest(layout, sources))
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(fused.kv.k[:, rows], full.kv.k[:, rows], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused.logits, full.logits, atol=1e-4, rtol=1e-4)
