"""The learned rule, its run-time features, recomputation windows and the routing ladder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adarag.config import RecomputeConfig
from adarag.engine.prefill_request import Collect, LearnedControls, PrefillRequest
from adarag.engine.routing import ROUTING_FEATURES, RoutingLadder
from adarag.engine.selection import value_deviation
from adarag.engine.token_features import RAW_COLUMNS, derive_features, raw_columns
from adarag.fitted import FittedModel
from tests.unit.engine.helpers import CHUNKS, QUESTION, independent_sources, layout_of
from tests.unit.engine.test_fusion import _engine
from tests.unit.engine.test_selection import _plan

LEARNED = RecomputeConfig(selection_policy="learned")


@pytest.fixture()
def engine(tiny_checkpoints, tiny_config):
    return _engine(tiny_checkpoints, tiny_config)


def _scorer(weights: dict[str, float]) -> FittedModel:
    names = tuple(weights)
    return FittedModel(names, (0.0,) * len(names), (1.0,) * len(names), tuple(weights.values()), 0)


def test_learned_without_a_scorer_is_query_deviation(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    learned = engine.prefill(PrefillRequest(layout, sources, selection=LEARNED))
    default = engine.prefill(PrefillRequest(layout, sources, selection=RecomputeConfig()))
    assert torch.equal(learned.recomputed_positions, default.recomputed_positions)
    torch.testing.assert_close(learned.logits, default.logits)


def test_a_scorer_changes_the_positions_and_ratio_one_is_still_full(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    default = engine.prefill(PrefillRequest(layout, sources, selection=LEARNED))
    late = _scorer({"rel_offset": 1.0})  # the last tokens of every chunk first
    scored = engine.prefill(
        PrefillRequest(
            layout, sources, selection=LEARNED, controls=LearnedControls(token_scorer=late)
        )
    )
    assert not torch.equal(scored.recomputed_positions, default.recomputed_positions)
    assert scored.num_recomputed_tokens == default.num_recomputed_tokens
    cu = layout.cu_segments
    chosen = [int(p) for p in scored.recomputed_positions if cu[1] <= p < cu[-2]]
    ends = {cu[i + 1] - 1 for i in range(1, len(cu) - 2)}  # each chunk's last token
    assert ends <= set(chosen)
    full = engine.prefill(PrefillRequest(layout))
    everything, _, _ = independent_sources(engine, layout, ratio=1.0)
    at_one = engine.prefill(
        PrefillRequest(
            layout, everything, selection=LEARNED, controls=LearnedControls(token_scorer=late)
        )
    )
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(at_one.kv.v[:, rows], full.kv.v[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(at_one.logits, full.logits, atol=1e-5, rtol=1e-5)


def test_collected_features_are_the_rules_own_inputs(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, chunk_kvs, _ = independent_sources(engine, layout, ratio=0.3)
    output = engine.prefill(
        PrefillRequest(layout, sources, selection=LEARNED, collect=Collect(features=True))
    )
    features = output.candidate_features
    num_layers = engine.spec.num_layers
    cu = layout.cu_segments
    assert features is not None and features.shape == (cu[-2] - cu[1], len(raw_columns(num_layers)))
    column = {name: features[:, idx] for idx, name in enumerate(raw_columns(num_layers))}
    lengths = [len(ids) for ids in layout.chunk_ids]
    expected_offsets = torch.cat([torch.arange(n, dtype=torch.float32) for n in lengths])
    assert torch.equal(column["offset"], expected_offsets)
    assert column["chunk_index"].tolist() == [
        float(i) for i, n in enumerate(lengths) for _ in range(n)
    ]
    assert set(column["num_chunks"].tolist()) == {float(len(CHUNKS))}
    # the cached V norm at the check layer is the stored chunk KV's
    check = LEARNED.deviation_check_layer
    cached_v = torch.cat([kv.v[check] for kv in chunk_kvs])
    torch.testing.assert_close(column["v_norm"], cached_v.float().pow(2).sum(dim=(1, 2)))
    # the query's attention is a distribution per query token: all-token mass sums to the
    # number of query tokens over every position, so over the candidates it is below that
    mass = features[:, len(RAW_COLUMNS) : len(RAW_COLUMNS) + num_layers]
    assert (mass >= 0).all() and (mass.sum(dim=0) <= len(layout.query_ids) + 1e-4).all()
    last = features[:, len(RAW_COLUMNS) + num_layers :]
    assert (last.sum(dim=0) <= 1.0 + 1e-5).all() and not torch.equal(mass, last)
    # a deviation of zero stays zero: the fresh V of an unchanged token equals its cached one
    assert (column["v_dev"] >= 0).all()
    assert value_deviation(cached_v, cached_v).abs().max() == 0


def test_derived_features_take_bands_logs_and_chunk_centring():
    num_layers = 4
    raw = np.zeros((5, len(raw_columns(num_layers))))
    column = {name: idx for idx, name in enumerate(raw_columns(num_layers))}
    raw[:, column["v_dev"]] = [1.0, 2.0, 4.0, 8.0, 16.0]
    raw[:, column["offset"]] = [0, 1, 2, 0, 1]
    raw[:, column["chunk_length"]] = [3, 3, 3, 2, 2]
    raw[:, column["chunk_index"]] = [0, 0, 0, 1, 1]
    raw[:, column["num_chunks"]] = 2
    raw[:, column["q_mass_1"]] = 0.5
    raw[:, column["q_mass_2"]] = 0.25
    names = ["log_v_dev", "log_v_dev@chunk", "log_q_mass:1-3", "rel_offset", "chunk_order"]
    derived = derive_features(raw, names, num_layers)
    np.testing.assert_allclose(derived[:, 0], np.log(raw[:, column["v_dev"]] + 1e-12))
    assert abs(derived[:3, 1].sum()) < 1e-9 and abs(derived[3:, 1].sum()) < 1e-9
    np.testing.assert_allclose(derived[:, 2], np.log(0.75 + 1e-12))
    np.testing.assert_allclose(derived[:, 3], [0, 1 / 3, 2 / 3, 0, 0.5])
    np.testing.assert_allclose(derived[:, 4], [0, 0, 0, 1, 1])
    for bad in ("log_q_mass:3-9", "nonsense", "log_v_dev@segment"):
        with pytest.raises(ValueError, match="feature|band"):
            derive_features(raw, [bad], num_layers)


def test_windows_spend_the_budget_on_runs_around_the_best_tokens():
    plan = _plan([2, 8, 8, 3], [None, 0.5, 0.5, None])  # system, two chunks of 8, query
    scores = torch.zeros(16)
    scores[3] = 10.0  # position 5: one peak in the first chunk
    scores[12] = 5.0  # position 14: one in the second
    alone = plan.choose(scores, RecomputeConfig(budget="global"))
    windowed = plan.choose(scores, RecomputeConfig(budget="global", span_tokens=4))
    assert len(alone) == len(windowed) == 8
    # the windows of w = 4 around each peak: peak - 1 .. peak + 2
    assert {4, 5, 6, 7} <= set(windowed.tolist()) and {13, 14, 15, 16} <= set(windowed.tolist())
    single = plan.choose(scores, RecomputeConfig(budget="global", span_tokens=1))
    assert torch.equal(single, alone)


def test_windows_stay_inside_their_chunk():
    plan = _plan([2, 4, 4, 3], [None, 0.5, 0.5, None])
    scores = torch.tensor([0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0])  # the first chunk's end
    windowed = plan.choose(scores, RecomputeConfig(budget="per_chunk", span_tokens=4))
    # per chunk 2 tokens: the peak and its neighbour in the same chunk, not the next chunk's
    assert windowed.tolist()[:2] == [4, 5]


def test_a_ladder_that_never_climbs_changes_nothing(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    plain = engine.prefill(PrefillRequest(layout, sources, selection=LEARNED))
    kept = engine.prefill(
        PrefillRequest(
            layout,
            sources,
            selection=LEARNED,
            controls=LearnedControls(ladder=RoutingLadder.fixed((0.6, 1.0), climb=False)),
        )
    )
    assert torch.equal(kept.recomputed_positions, plain.recomputed_positions)
    torch.testing.assert_close(kept.logits, plain.logits, atol=1e-6, rtol=1e-6)
    assert [rung.climbed for rung in kept.routing] == [False]
    assert kept.routing[0].probability == pytest.approx(0.5)
    assert len(kept.routing[0].features) == len(ROUTING_FEATURES)


def test_climbing_tops_up_and_the_top_rung_equals_full_prefill(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    plain = engine.prefill(PrefillRequest(layout, sources, selection=LEARNED))
    halfway = engine.prefill(
        PrefillRequest(
            layout,
            sources,
            selection=LEARNED,
            controls=LearnedControls(ladder=RoutingLadder.fixed((0.6,), climb=True)),
        )
    )
    at_six, _, _ = independent_sources(engine, layout, ratio=0.6)
    six = engine.prefill(PrefillRequest(layout, at_six, selection=LEARNED))
    # the climb adds the tokens a request at 0.6 chooses, keeping those recomputed at 0.3
    assert set(plain.recomputed_positions.tolist()) < set(halfway.recomputed_positions.tolist())
    assert set(six.recomputed_positions.tolist()) <= set(halfway.recomputed_positions.tolist())
    assert [rung.ratio for rung in halfway.routing] == [0.3, 0.6]
    assert [rung.climbed for rung in halfway.routing] == [True, False]
    assert halfway.routing[-1].probability is None
    assert not torch.allclose(halfway.logits, plain.logits)
    full = engine.prefill(PrefillRequest(layout))
    top = engine.prefill(
        PrefillRequest(
            layout,
            sources,
            selection=LEARNED,
            controls=LearnedControls(ladder=RoutingLadder.fixed((0.6, 1.0), climb=True)),
        )
    )
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(top.kv.k[:, rows], full.kv.k[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(top.kv.v[:, rows], full.kv.v[:, rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(top.logits, full.logits, atol=1e-5, rtol=1e-5)
    assert [rung.ratio for rung in top.routing] == [0.3, 0.6, 1.0]
