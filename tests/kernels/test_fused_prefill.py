"""The fused prefill through the engine with the Triton kernels matches it with the torch twins."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.prefill_request import Collect, PrefillRequest
from adarag.kernels._dispatch import is_triton_interpreted
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import (
    CHUNKS,
    QUESTION,
    independent_sources,
    layout_of,
    load_engine,
)

TARGETS = [
    pytest.param("cpu", "float32", id="cpu-interpreted-float32"),
    pytest.param("cuda", "float32", marks=pytest.mark.gpu, id="cuda-float32"),
    pytest.param("cuda", "bfloat16", marks=pytest.mark.gpu, id="cuda-bfloat16"),
]
TOLERANCES = {"float32": {"atol": 1e-4, "rtol": 1e-4}, "bfloat16": {"atol": 1e-1, "rtol": 5e-2}}


def _engines(tiny_checkpoints, tiny_config, device, dtype):
    if device == "cpu" and not is_triton_interpreted():
        pytest.skip("interpreting Triton on the CPU needs TRITON_INTERPRET=1")
    return {
        backend: load_engine(
            tiny_config(
                tiny_checkpoints["llama"],
                engine={"device": device, "dtype": dtype},
                kernels={"backend": backend},
            )
        )
        for backend in ("torch", "triton")
    }


def _assert_close(actual, expected, dtype):
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **TOLERANCES[dtype])


@pytest.mark.parametrize(("device", "dtype"), TARGETS)
def test_full_and_reused_prefill_match_torch(device, dtype, tiny_checkpoints, tiny_config):
    engines = _engines(tiny_checkpoints, tiny_config, device, dtype)
    layout = layout_of(engines["torch"], QUESTION, CHUNKS)
    rows = slice(0, layout.num_tokens)
    # --- full prefill, with per-layer segment attention
    full = {
        backend: engine.prefill(
            PrefillRequest(layout, max_new_tokens=4, collect=Collect(segment_attention=True))
        )
        for backend, engine in engines.items()
    }
    _assert_close(full["triton"].logits, full["torch"].logits, dtype)
    _assert_close(full["triton"].kv.k[:, rows], full["torch"].kv.k[:, rows], dtype)
    _assert_close(full["triton"].kv.v[:, rows], full["torch"].kv.v[:, rows], dtype)
    _assert_close(full["triton"].segment_attention, full["torch"].segment_attention, dtype)
    # --- reuse every chunk's independent KV (re-rotated), recompute only the query
    sources, _, _ = independent_sources(engines["torch"], layout, ratio=0.0)
    reused = {backend: g.prefill(PrefillRequest(layout, sources)) for backend, g in engines.items()}
    _assert_close(reused["triton"].logits, reused["torch"].logits, dtype)
    _assert_close(reused["triton"].kv.k[:, rows], reused["torch"].kv.k[:, rows], dtype)


@pytest.mark.parametrize(("device", "dtype"), [TARGETS[0], TARGETS[1]])
def test_selective_recomputation_and_decode_match_torch(
    device, dtype, tiny_checkpoints, tiny_config
):
    # float32 only: the twin's segment masses carry the input dtype's rounding, so bfloat16
    # near-ties may rank differently
    engines = _engines(tiny_checkpoints, tiny_config, device, dtype)
    layout = layout_of(engines["torch"], QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engines["torch"], layout, ratio=0.5)
    fused = {
        backend: engine.prefill(PrefillRequest(layout, sources, max_new_tokens=4))
        for backend, engine in engines.items()
    }
    assert torch.equal(fused["triton"].recomputed_positions, fused["torch"].recomputed_positions)
    _assert_close(fused["triton"].logits, fused["torch"].logits, dtype)
    signals = {b: g.lens_signals(fused[b], num_lens_layers=2) for b, g in engines.items()}
    _assert_close(torch.tensor(signals["triton"][0]), torch.tensor(signals["torch"][0]), dtype)
    assert signals["triton"][1] == pytest.approx(signals["torch"][1], abs=1e-4)
    params = GenerationParams(max_new_tokens=4, temperature=0.0)
    tokens = {b: list(g.decode_tokens(layout, fused[b], params)) for b, g in engines.items()}
    assert tokens["triton"] == tokens["torch"]
