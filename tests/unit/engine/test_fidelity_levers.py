"""The fidelity levers change what is recomputed, keep the budget, and vanish at ratio 1."""

from __future__ import annotations

import statistics

import pytest
import torch

from adarag.config import RecomputeConfig
from adarag.engine.prefill_request import OracleInputs, PrefillRequest
from adarag.engine.routing import ROUTING_FEATURES
from adarag.engine.selection import allocate, layer_budget_factor
from adarag.errors import InputError
from adarag.kernels import lens_signals_from_logits
from tests.unit.engine.helpers import CHUNKS, QUESTION, independent_sources, layout_of
from tests.unit.engine.test_fusion import _engine
from tests.unit.engine.test_selection import _plan

LEVERS = {
    "chunk_start": {"chunk_start_tokens": 2},
    "query_allocation": {"chunk_allocation": "query"},
    "gradual": {"layer_schedule": "gradual", "layer_spread": 1.0},
}


def test_chunk_start_tokens_are_chosen_inside_the_budget():
    plan = _plan([2, 4, 4, 3], [None, 0.5, 0.5, None])  # system, two chunks, query
    scores = torch.tensor([0.0, 0.9, 0.8, 0.1, 0.0, 0.0, 0.7, 0.6])  # positions 2..9
    base = RecomputeConfig(budget="per_chunk")
    assert plan.choose(scores, base).tolist() == [3, 4, 8, 9]
    sinks = RecomputeConfig(budget="per_chunk", chunk_start_tokens=1)
    assert plan.choose(scores, sinks).tolist() == [2, 3, 6, 8]  # first token + the best one
    pooled = RecomputeConfig(budget="global", chunk_start_tokens=1)
    assert plan.choose(scores, pooled).tolist() == [2, 3, 4, 6]  # first tokens + the best two


def test_allocate_follows_the_weights_and_the_caps():
    assert allocate(10, [3.0, 1.0], [100, 100]) == [8, 2]  # 7.5 / 2.5, the larger remainder
    assert allocate(10, [3.0, 1.0], [4, 100]) == [4, 6]  # what the capped one cannot take
    assert allocate(6, [0.0, 0.0, 0.0], [5, 5, 5]) == [2, 2, 2]
    assert allocate(50, [1.0, 1.0], [3, 4]) == [3, 4]
    assert sum(allocate(7, [0.2, 0.5, 0.3], [9, 9, 9])) == 7


def test_segment_weights_share_the_total_between_chunks():
    plan = _plan([2, 4, 4, 3], [None, 0.5, 0.5, None])
    scores = torch.tensor([0.0, 0.9, 0.8, 0.1, 0.0, 0.0, 0.7, 0.6])
    chosen = plan.choose(scores, RecomputeConfig(), segment_weights=torch.tensor([0, 3.0, 1, 0]))
    assert chosen.tolist() == [3, 4, 5, 8]  # three tokens of the first chunk, one of the second


def test_gradual_schedule_averages_to_the_ratio():
    selection = RecomputeConfig(layer_schedule="gradual", layer_spread=0.5)
    factors = [layer_budget_factor(layer, 24, selection) for layer in range(24)]
    assert statistics.fmean(factors) == pytest.approx(1.0)
    assert factors[0] == pytest.approx(1.5) and factors[-1] == pytest.approx(0.5)
    assert layer_budget_factor(3, 24, RecomputeConfig()) == 1.0


@pytest.fixture()
def engine(tiny_checkpoints, tiny_config):
    return _engine(tiny_checkpoints, tiny_config)


@pytest.mark.parametrize("lever", LEVERS)
def test_each_lever_changes_the_fused_prefill_at_one_budget(engine, lever):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    # cross_attention scores at layer 0, so the layers above it are the schedule's to narrow
    base = RecomputeConfig(selection_policy="cross_attention")
    other = base.model_copy(update=LEVERS[lever])
    first = engine.prefill(PrefillRequest(layout, sources, selection=base))
    second = engine.prefill(PrefillRequest(layout, sources, selection=other))
    rows = slice(0, layout.num_tokens)
    if lever == "gradual":  # more tokens start; none of them reaches the last layer
        assert second.num_recomputed_tokens > first.num_recomputed_tokens
        assert not torch.equal(first.kv.v[-1, rows], second.kv.v[-1, rows])
    else:
        assert first.num_recomputed_tokens == second.num_recomputed_tokens
        assert not torch.equal(first.recomputed_positions, second.recomputed_positions)


def test_chunk_start_lever_recomputes_each_chunks_first_tokens(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    selection = RecomputeConfig(chunk_start_tokens=2)
    chosen = set(
        engine.prefill(PrefillRequest(layout, sources, selection=selection)).recomputed_positions
    )
    for start in layout.cu_segments[1:-2]:
        assert {start, start + 1} <= {int(p) for p in chosen}


@pytest.mark.parametrize("lever", LEVERS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_ratio_one_with_a_lever_matches_full_prefill(lever, family, tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config, family)
    layout = layout_of(engine, QUESTION, CHUNKS)
    full = engine.prefill(PrefillRequest(layout))
    sources, _, _ = independent_sources(engine, layout, ratio=1.0)
    fused = engine.prefill(
        PrefillRequest(layout, sources, selection=RecomputeConfig(**LEVERS[lever]))
    )
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(fused.kv.k[:, rows], full.kv.k[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.kv.v[:, rows], full.kv.v[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.logits, full.logits, atol=1e-5, rtol=1e-5)


def test_a_raised_plan_lifts_only_the_candidate_chunks_below_the_ratio():
    plan = _plan([2, 4, 8, 3], [None, 0.25, 0.75, None])  # system, two chunks, query
    raised = plan.raised(0.5)
    assert raised.ratios == (0.0, 0.5, 0.75, 0.0)
    assert raised.budgets == (0, 2, 6, 0)
    assert plan.raised(1.0).budgets == (0, 4, 8, 0)
    assert torch.equal(raised.candidates, plan.candidates)


@pytest.mark.parametrize("rule", ["query_deviation", "kv_deviation"])
def test_uncertainty_routing_raises_the_ratio_of_an_uncertain_request(engine, rule):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, chunk_kvs, system_kv = independent_sources(engine, layout, ratio=0.3)
    # the query pass's next-token distribution is the one over the reused KV: ratio 0's
    reused, _, _ = independent_sources(engine, layout, ratio=0.0)
    uncertainty = float(
        lens_signals_from_logits(engine.prefill(PrefillRequest(layout, reused)).logits[None])[1]
    )
    base = RecomputeConfig(selection_policy=rule)
    plain = engine.prefill(PrefillRequest(layout, sources, selection=base))
    rows = slice(0, layout.num_tokens)

    def routed(threshold: float, ratio: float = 1.0):
        update = {"uncertain_entropy": threshold, "uncertain_ratio": ratio}
        return engine.prefill(
            PrefillRequest(layout, sources, selection=base.model_copy(update=update))
        )

    confident = routed(uncertainty * 1.01)  # below the threshold: the request's own ratio
    assert torch.equal(confident.recomputed_positions, plain.recomputed_positions)
    torch.testing.assert_close(confident.logits, plain.logits, atol=1e-6, rtol=1e-6)
    full = engine.prefill(PrefillRequest(layout))
    to_full = routed(uncertainty * 0.99)  # above it at uncertain_ratio 1: full recomputation
    torch.testing.assert_close(to_full.kv.v[:, rows], full.kv.v[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(to_full.logits, full.logits, atol=1e-5, rtol=1e-5)
    reused_rows = layout.num_tokens - len(layout.system_ids)  # the system prefix is exact
    assert plain.num_recomputed_tokens < to_full.num_recomputed_tokens == reused_rows
    # routed to 0.6: the positions a request at ratio 0.6 chooses
    at_six = engine.prefill(
        PrefillRequest(layout, independent_sources(engine, layout, ratio=0.6)[0], selection=base)
    )
    to_six = routed(uncertainty * 0.99, 0.6)
    assert torch.equal(to_six.recomputed_positions, at_six.recomputed_positions)
    assert to_six.num_recomputed_tokens > plain.num_recomputed_tokens
    # the trace says what routing did, with the entropy it read
    entropy_at = ROUTING_FEATURES.index("entropy_reused")
    assert [(r.ratio, r.climbed) for r in confident.routing] == [(0.3, False)]
    assert [(r.ratio, r.climbed) for r in to_six.routing] == [(0.3, True), (0.6, False)]
    assert confident.routing[0].features[entropy_at] == pytest.approx(uncertainty, rel=1e-4)
    assert plain.routing == ()


def test_output_oracle_recomputes_the_positions_scored_highest(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.2)
    selection = RecomputeConfig(selection_policy="output_oracle")
    with pytest.raises(InputError, match="output_oracle.*position_scores"):
        engine.prefill(PrefillRequest(layout, sources, selection=selection))
    scores = torch.zeros(layout.num_tokens)
    first_chunk = range(layout.cu_segments[1], layout.cu_segments[2])
    scores[list(first_chunk)] = torch.arange(1, len(first_chunk) + 1, dtype=torch.float32)
    output = engine.prefill(
        PrefillRequest(
            layout, sources, selection=selection, oracle=OracleInputs(position_scores=scores)
        )
    )
    chosen = [int(p) for p in output.recomputed_positions if p < layout.cu_segments[-2]]
    chosen = [p for p in chosen if p >= layout.cu_segments[1]]
    assert 0 < len(chosen) < len(first_chunk)
    assert chosen == list(first_chunk)[-len(chosen) :]  # the best-scored, all from chunk one


def test_key_bias_adds_to_the_logits_and_never_unmasks_the_future():
    from adarag.kernels.selective_attention import selective_attention_ref

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8)
    positions = torch.tensor([4, 7, 9])
    bias = torch.zeros(10)
    bias[2:6] = -1.5
    out = selective_attention_ref(q, k, v, positions, 0.35, key_bias=bias)
    keys = k.repeat_interleave(2, dim=1)
    logits = torch.einsum("qhd,khd->qhk", q, keys) * 0.35 + bias
    logits = logits.masked_fill(torch.arange(10)[None, None] > positions[:, None, None], -1e9)
    expected = torch.einsum("qhk,khd->qhd", logits.softmax(-1), v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    later = k.clone()
    later[8:] += 5.0  # keys after the first query's position
    changed = selective_attention_ref(q, later, v, positions, 0.35, key_bias=bias)
    torch.testing.assert_close(changed[0], out[0])


def test_attention_rescaling_changes_reused_rows_only(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.0)
    plain = engine.prefill(PrefillRequest(layout, sources))
    rescaled = engine.prefill(
        PrefillRequest(
            layout, sources, selection=RecomputeConfig(context_temperature=0.9, context_scale=0.9)
        )
    )
    assert not torch.allclose(plain.logits, rescaled.logits)
    system = slice(0, len(layout.system_ids))
    torch.testing.assert_close(rescaled.kv.k[:, system], plain.kv.k[:, system])  # exact prefix
    chunk = slice(layout.cu_segments[1], layout.cu_segments[2])
    torch.testing.assert_close(rescaled.kv.k[:, chunk], plain.kv.k[:, chunk] / 0.9)
    full_sources, _, _ = independent_sources(engine, layout, ratio=1.0)
    full = engine.prefill(PrefillRequest(layout))
    at_one = engine.prefill(
        PrefillRequest(
            layout,
            full_sources,
            selection=RecomputeConfig(context_temperature=0.9, context_scale=0.9),
        )
    )
    torch.testing.assert_close(at_one.logits, full.logits, atol=1e-5, rtol=1e-5)
