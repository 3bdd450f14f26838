"""Fused prefill: exactness at ratio 1 and 0, re-positioning, the causal mask, selection."""

from __future__ import annotations

import math

import pytest
import torch

from adarag.config import AdaRagConfig, RecomputeConfig
from adarag.engine.prefill_request import Collect, OracleInputs, PrefillRequest
from adarag.kernels import rope_delta
from adarag.schema import PromptLayout
from tests.tiny_models import load_hf_model
from tests.unit.engine.helpers import (
    CHUNKS,
    QUESTION,
    hf_logits_with_past,
    independent_sources,
    layout_of,
    load_engine,
)

POLICIES = [
    "cross_attention",
    "kv_deviation",
    "query_attention",
    "query_deviation",
    "random",
    "oracle",
]
# query-aware selection reads the query, so a later (query) token may change which chunk
# tokens are recomputed; the other rules never look past a chunk token's own position
QUERY_BLIND = [p for p in POLICIES if p not in ("query_attention", "query_deviation")]


def _engine(tiny_checkpoints, tiny_config, family="llama"):
    return load_engine(tiny_config(tiny_checkpoints[family]))


def _selection(policy, **knobs):
    return RecomputeConfig(selection_policy=policy, **knobs)


def _fused(engine, layout, sources, policy, **knobs):
    """A fused prefill with ``policy`` (the oracle's reference is a full prefill of ``layout``)."""
    reference = engine.prefill(PrefillRequest(layout)).kv if policy == "oracle" else None
    selection = _selection(policy, **knobs)
    return engine.prefill(
        PrefillRequest(
            layout, sources, selection=selection, oracle=OracleInputs(reference_kv=reference)
        )
    )


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "llama-hd32"])
def test_ratio_one_matches_full_prefill(family, policy, tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config, family)
    layout = layout_of(engine, QUESTION, CHUNKS)
    full = engine.prefill(PrefillRequest(layout))
    sources, _, _ = independent_sources(engine, layout, ratio=1.0)
    fused = _fused(engine, layout, sources, policy)
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(fused.kv.k[:, rows], full.kv.k[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.kv.v[:, rows], full.kv.v[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.logits, full.logits, atol=1e-5, rtol=1e-5)
    assert fused.num_recomputed_tokens == layout.num_tokens - len(layout.system_ids)


def test_ratio_zero_is_repositioned_cache_plus_recomputed_query(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, chunk_kvs, system_kv = independent_sources(engine, layout, ratio=0.0)
    fused = engine.prefill(PrefillRequest(layout, sources))
    cu = layout.cu_segments
    # chunk rows are exactly the cached KV rotated to their new positions
    for idx, chunk_kv in enumerate(chunk_kvs):
        start, end = cu[idx + 1], cu[idx + 2]
        delta = torch.full((end - start,), start - chunk_kv.start_position)
        expected_k = rope_delta(chunk_kv.k, delta, engine.runner.inv_freq)
        assert torch.equal(fused.kv.k[:, start:end], expected_k)
        assert torch.equal(fused.kv.v[:, start:end], chunk_kv.v)
    assert torch.equal(fused.kv.k[:, : cu[1]], system_kv.k)
    # the query is computed against that KV exactly as transformers would
    hf_model = load_hf_model(engine.checkpoint.path)
    reference = hf_logits_with_past(hf_model, fused, cu[-2], list(layout.query_ids))
    torch.testing.assert_close(fused.logits, reference, atol=2e-5, rtol=1e-5)
    assert fused.recomputed_positions.tolist() == list(range(cu[-2], cu[-1]))


def test_repositioned_key_equals_key_computed_at_target(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    _, chunk_kvs, _ = independent_sources(engine, layout, ratio=0.0)
    # Layer-0 keys depend only on token and position: compare the third chunk moved from right
    # after the system prefix to its place in the full prompt with the full prefill's keys.
    full = engine.prefill(PrefillRequest(layout))
    start, end = layout.cu_segments[3], layout.cu_segments[4]
    moved = chunk_kvs[2]
    delta = torch.full((moved.num_tokens,), start - moved.start_position)
    rotated = rope_delta(moved.k[0], delta, engine.runner.inv_freq)
    torch.testing.assert_close(rotated, full.kv.k[0, start:end], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", QUERY_BLIND)
def test_changing_a_later_token_never_changes_earlier_outputs(
    policy, tiny_checkpoints, tiny_config
):
    engine = _engine(tiny_checkpoints, tiny_config)
    selection = _selection(policy)
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.5)
    changed_query = (
        *layout.query_ids[:-3],
        (layout.query_ids[-3] + 7) % 250,
        *layout.query_ids[-2:],
    )
    other = PromptLayout(layout.system_ids, layout.chunk_ids, changed_query)
    reference = engine.prefill(PrefillRequest(layout)).kv  # the oracle scores chunk rows only
    first = engine.prefill(
        PrefillRequest(
            layout, sources, selection=selection, oracle=OracleInputs(reference_kv=reference)
        )
    )
    second = engine.prefill(
        PrefillRequest(
            other, sources, selection=selection, oracle=OracleInputs(reference_kv=reference)
        )
    )
    changed_at = layout.num_tokens - 3
    torch.testing.assert_close(
        first.kv.k[:, :changed_at], second.kv.k[:, :changed_at], atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        first.kv.v[:, :changed_at], second.kv.v[:, :changed_at], atol=1e-6, rtol=0
    )
    # the change is visible from its own position on, so the comparison above can fail
    assert not torch.allclose(first.kv.v[1:, changed_at:], second.kv.v[1:, changed_at:])
    assert torch.equal(first.recomputed_positions, second.recomputed_positions)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("ratio", [0.1, 0.35])
def test_selection_recomputes_ceil_ratio_of_each_chunk(
    policy, ratio, tiny_checkpoints, tiny_config
):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=ratio)
    fused = _fused(engine, layout, sources, policy, budget="per_chunk")
    again = _fused(engine, layout, sources, policy, budget="per_chunk")
    assert torch.equal(fused.recomputed_positions, again.recomputed_positions)
    cu = layout.cu_segments
    positions = fused.recomputed_positions
    for idx, ids in enumerate(layout.chunk_ids):
        in_chunk = ((positions >= cu[idx + 1]) & (positions < cu[idx + 2])).sum()
        assert int(in_chunk) == math.ceil(ratio * len(ids))
    assert positions[-len(layout.query_ids) :].tolist() == list(range(cu[-2], cu[-1]))


def test_higher_ratio_brings_kv_closer_to_full_prefill(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    full = engine.prefill(PrefillRequest(layout))
    errors = []
    # cross_attention scores at layer 0 only; kv_deviation (check layer 1) would recompute both
    # layers of a 2-layer model for every candidate, exact at any ratio
    selection = _selection("cross_attention")
    for ratio in (0.0, 0.5, 1.0):
        sources, _, _ = independent_sources(engine, layout, ratio=ratio)
        fused = engine.prefill(PrefillRequest(layout, sources, selection=selection))
        rows = slice(0, layout.num_tokens)
        errors.append(float((fused.kv.v[:, rows] - full.kv.v[:, rows]).norm()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4


def test_segment_attention_rows_sum_to_one(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    output = engine.prefill(PrefillRequest(layout, collect=Collect(segment_attention=True)))
    assert output.segment_attention is not None
    num_segments = len(layout.segments)
    assert output.segment_attention.shape == (2, num_segments, num_segments)
    torch.testing.assert_close(
        output.segment_attention.sum(-1), torch.ones(2, num_segments), atol=1e-5, rtol=0
    )
    # causal: no segment attends to a later one
    assert torch.all(output.segment_attention.triu(diagonal=1) == 0)


def test_default_config_has_no_tiny_model_knobs():
    assert AdaRagConfig().engine.model == "default"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_prefill_lens_logits_give_the_signals_of_a_separate_lens_pass(
    family, tiny_checkpoints, tiny_config
):
    engine = _engine(tiny_checkpoints, tiny_config, family)
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    plain = engine.prefill(PrefillRequest(layout, sources))
    num_layers = engine.spec.num_layers
    with_lens = engine.prefill(
        PrefillRequest(layout, sources, collect=Collect(num_lens_layers=num_layers + 1))
    )  # clamped
    assert plain.lens_logits is None and with_lens.lens_logits.shape[0] == num_layers
    torch.testing.assert_close(with_lens.lens_logits[-1], with_lens.logits)
    torch.testing.assert_close(with_lens.logits, plain.logits)
    fused_kl, fused_entropy = engine.lens_signals(with_lens, num_layers)
    separate_kl, separate_entropy = engine.lens_signals(plain, num_layers)  # from hidden
    assert len(fused_kl) == num_layers - 1
    assert fused_kl == pytest.approx(separate_kl, rel=1e-4, abs=1e-6)
    assert fused_entropy == pytest.approx(separate_entropy, rel=1e-5)
