"""The output-aware oracle's differentiable pass is the engine's forward, and its gradient is."""

from __future__ import annotations

import pytest
import torch

from adarag.config import RecomputeConfig
from adarag.engine.prefill_request import LearnedControls, OracleInputs, PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.output_oracle import AnswerLoss, output_oracle_scores
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


def _setup(tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints["qwen2"]))
    layout = layout_of(engine, QUESTION, CHUNKS)
    full = engine.prefill(PrefillRequest(layout))
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    reused = engine.prefill(PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 0.0)))
    answer = [int(full.logits.argmax()), 5, 7]
    return engine, layout, full, reused, (system_kv, chunk_kvs), answer


def test_mixed_pass_reproduces_the_engine_at_both_ends(tiny_checkpoints, tiny_config):
    engine, layout, full, reused, _, answer = _setup(tiny_checkpoints, tiny_config)
    loss = AnswerLoss(engine, layout, reused.kv, full.kv, answer)
    context = layout.cu_segments[-2]
    with torch.no_grad():
        exact = loss.logits(torch.ones(context))[0]
        cached = loss.logits(torch.zeros(context))[0]
    torch.testing.assert_close(exact, full.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cached, reused.logits, atol=1e-4, rtol=1e-4)


def test_gain_is_the_loss_derivative(tiny_checkpoints, tiny_config):
    engine, layout, full, reused, _, answer = _setup(tiny_checkpoints, tiny_config)
    loss = AnswerLoss(engine, layout, reused.kv, full.kv, answer)
    context = layout.cu_segments[-2]
    mix = torch.zeros(context, dtype=torch.float64).float()
    gain = loss.gain(mix)
    position = int(torch.argmax(gain.abs()))
    step = torch.zeros(context)
    step[position] = 1e-2
    with torch.no_grad():
        before = float(loss._loss(mix))
        after = float(loss._loss(mix + step))
    assert abs((before - after) / 1e-2 - float(gain[position])) < 0.05 * abs(float(gain[position]))


def test_scores_pick_the_budget_and_drive_the_output_oracle(tiny_checkpoints, tiny_config):
    engine, layout, full, reused, (system_kv, chunk_kvs), answer = _setup(
        tiny_checkpoints, tiny_config
    )
    scores = output_oracle_scores(engine, layout, reused.kv, full.kv, answer, ratio=0.2)
    budget = sum(-(-len(ids) * 2 // 10) for ids in layout.chunk_ids)
    assert int((scores >= 1e6).sum()) == budget
    assert torch.isinf(scores[: layout.cu_segments[1]]).all()  # the system prefix is exact
    sources = reuse_sources(system_kv, chunk_kvs, 0.2)
    selection = RecomputeConfig(selection_policy="output_oracle")
    output = engine.prefill(
        PrefillRequest(
            layout, sources, selection=selection, oracle=OracleInputs(position_scores=scores)
        )
    )
    chosen = set(output.recomputed_positions.tolist())
    assert {int(p) for p in (scores >= 1e6).nonzero().squeeze(1)} <= chosen


def test_the_attention_it_collects_is_each_layer_s_over_the_context(tiny_checkpoints, tiny_config):
    engine, layout, full, reused, _, answer = _setup(tiny_checkpoints, tiny_config)
    loss = AnswerLoss(engine, layout, reused.kv, full.kv, answer)
    context = layout.cu_segments[-2]
    attention: list[torch.Tensor] = []
    with torch.no_grad():
        plain = loss.logits(torch.zeros(context))
        torch.testing.assert_close(loss.logits(torch.zeros(context), attention), plain)
    rows = loss.token_ids.numel()
    assert len(attention) == engine.spec.num_layers
    for layer in attention:
        assert layer.shape == (rows, context)
        # a row's mass over the context is what its own tokens (the query and answer) leave
        assert bool((layer >= 0).all()) and bool((layer.sum(dim=1) <= 1 + 1e-5).all())
        assert float(layer.sum(dim=1).min()) > 0.0
    assert not torch.allclose(attention[0], attention[-1])


def test_another_answer_shares_the_context_and_scores_as_a_new_loss(tiny_checkpoints, tiny_config):
    engine, layout, full, reused, _, answer = _setup(tiny_checkpoints, tiny_config)
    loss = AnswerLoss(engine, layout, reused.kv, full.kv, answer)
    other_answer = [3, 9]
    other = loss.with_answer(other_answer)
    assert other.delta_v is loss.delta_v and other.cached_k is loss.cached_k
    context = layout.cu_segments[-2]
    mix = torch.rand(context, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = AnswerLoss(engine, layout, reused.kv, full.kv, other_answer).logits(mix)
        torch.testing.assert_close(other.logits(mix), expected)
        assert loss.logits(mix).shape[0] == len(answer)  # the first loss keeps its answer


def test_a_bridged_query_embeds_its_packet_rows_as_the_engine_does(tiny_checkpoints, tiny_config):
    engine, layout, full, _, (system_kv, chunk_kvs), answer = _setup(tiny_checkpoints, tiny_config)
    bridge = LearnedControls(packet=torch.randn(3, engine.spec.hidden_size), bridge_tokens=3)
    sources = reuse_sources(system_kv, chunk_kvs, 0.0)
    bridged = bridge.bridged(layout, sources, engine.spec.vocab_size)
    assert bridged.num_tokens == layout.num_tokens + 3
    reused = engine.prefill(PrefillRequest(bridged, sources, controls=bridge))
    loss = AnswerLoss(engine, bridged, reused.kv, full.kv, answer, bridge.packet)
    with torch.no_grad():
        cached = loss.logits(torch.zeros(bridged.cu_segments[-2]))[0]
    torch.testing.assert_close(cached, reused.logits, atol=1e-4, rtol=1e-4)
    with pytest.raises(InputError, match="packet table"):
        AnswerLoss(engine, bridged, reused.kv, full.kv, answer).logits(torch.zeros(1))
