"""Cache-Craft: variant choice by CFO, ceil(CFO x |C|) recomputed tokens, budget and eviction."""

from __future__ import annotations

import math

import pytest
import torch

from adarag.cache.variants import (
    Variant,
    VariantIndex,
    VariantStats,
    cache_fix_overhead,
    order_penalty,
    prefix_overlap,
    variant_stats,
)
from adarag.config import VariantConfig
from adarag.engine.focus import FocusTracker, focused_chunks
from adarag.engine.prefill_request import PrefillRequest
from adarag.pipeline import AdaRAG
from adarag.policies import POLICIES
from tests.unit.engine.helpers import CHUNKS, QUESTION

EXTRA = "the lazy dog sleeps by the quick river in paris."


def _variant(key: str, prefix: tuple[str, ...], inter: tuple[float, ...], cci: float) -> Variant:
    return Variant(key, "c", prefix, VariantStats(inter, cci, (0, 1, 2)))


def test_order_penalty_is_the_normalised_kendall_tau_distance():
    assert order_penalty(("a", "b", "c"), ("a", "b", "c")) == 0.0
    assert order_penalty(("a", "b", "c"), ("c", "b", "a")) == 1.0
    assert order_penalty(("a", "b", "c"), ("a", "c", "b")) == pytest.approx(1 / 3)
    assert order_penalty(("a", "b"), ("b", "x")) == 0.0  # one shared chunk: no pair


def test_prefix_overlap_weighs_shared_chunks_by_their_attention():
    assert prefix_overlap(("a", "b"), (3.0, 1.0), ("b", "a", "z")) == 1.0
    assert prefix_overlap(("a", "b"), (3.0, 1.0), ("a", "z")) == pytest.approx(0.75)
    assert prefix_overlap(("a", "b"), (3.0, 1.0), ("z",)) == 0.0
    assert prefix_overlap((), (), ()) == 1.0  # computed first, used first: exact
    assert prefix_overlap((), (), ("a",)) == 0.0


@pytest.mark.parametrize(
    ("new_prefix", "expected_key", "expected_cfo"),
    [
        (("a", "b"), "same", 0.0),
        (("a", "z"), "same", 0.8 * (1 - 0.75)),
        (("x", "q"), "other", 0.0),
        (("b", "a"), "reversed", 0.0),
        (("z",), "other", 0.6),
    ],
)
def test_the_variant_with_the_lowest_cfo_is_chosen(new_prefix, expected_key, expected_cfo):
    index = VariantIndex(VariantConfig(enabled=True))
    variants = [
        _variant("same", ("a", "b"), (3.0, 1.0), 0.8),
        _variant("other", ("x",), (1.0,), 0.6),
        _variant("reversed", ("b", "a"), (1.0, 1.0), 0.9),
    ]
    for variant in variants:
        index.add(variant)
    cfos = {v.key: cache_fix_overhead(v, new_prefix, 1.0) for v in variants}
    chosen, cfo = index.best("c", new_prefix)
    assert chosen.key == expected_key
    assert cfo == pytest.approx(expected_cfo) == pytest.approx(min(cfos.values()))
    # with alpha the overhead scales, clipped to 1
    assert cache_fix_overhead(variants[1], ("z",), 2.0) == pytest.approx(1.0)


def test_budget_evicts_the_lowest_frequency_reusability_score():
    index = VariantIndex(VariantConfig(enabled=True, max_chunks=1, max_variants_per_chunk=2))
    first = Variant("first", "c", ("a",), VariantStats((1.0,), 0.7, (0,)))
    second = Variant("second", "d", ("b",), VariantStats((1.0,), 0.7, (0,)))
    assert index.add(first) == [] and index.add(second) == []
    # the older variant is used (f_r grows by 1 / CFO), so the newer one is the lowest
    chosen, cfo = index.best("c", ("z",))
    assert chosen is first and first.frequency_reusability == pytest.approx(1 / cfo)
    third = Variant("third", "e", (), VariantStats((), 0.5, (0,)))
    assert index.add(third) == [second]
    assert index.num_variants == 2 and index.best("d", ()) is None
    # on equal scores the oldest goes
    fourth = Variant("fourth", "f", (), VariantStats((), 0.5, (0,)))
    assert index.add(fourth) == [third]


def test_variant_stats_follow_the_cci_definition_and_rank_by_prefix_attention():
    # segments: system (2 tokens), prefix chunk (4), the chunk (3), query; 2 layers
    lengths = [2, 4, 3, 5]
    mass = torch.zeros(2, 3, 4)
    mass[:, :, 0] = 0.2  # the system prefix is never part of a variant's prefix
    mass[:, 0, 1], mass[:, 1, 1], mass[:, 2, 1] = 0.1, 0.5, 0.3
    mass[:, :, 2] = 1.0 - mass[:, :, 0] - mass[:, :, 1]
    stats = variant_stats(mass, 2, lengths)
    inter = 0.9
    a = inter / (3 * 4)
    b = float(mass[0, :, 2].sum()) / 3**2
    assert stats.inter == pytest.approx((inter,))
    assert stats.cci == pytest.approx(1 / (1 + math.exp(-a / b)))
    assert stats.ranking == (1, 2, 0)


@pytest.fixture()
def craft(tiny_checkpoints, tiny_config):
    overrides = POLICIES["cachecraft"].overrides
    cache = {**overrides["cache"], "store": {"storage_dtype": "float32"}}
    config = tiny_config(
        tiny_checkpoints["llama"],
        cache=cache,
        augment=overrides["augment"],
        experimental=overrides["experimental"],
    )
    return AdaRAG(config)


def _prefill_and_keep(rag, chunks):
    layout = rag.prompts.layout(QUESTION, chunks)
    output, hits, _ = rag.augmentation.fused_prefill(layout, 0)
    rag.augmentation.write_back(layout, output, hits)
    return layout, output, hits


def test_recomputes_ceil_cfo_tokens_of_the_stored_ranking(craft):
    _prefill_and_keep(craft, [CHUNKS[0], CHUNKS[1]])
    assert craft.cache.variants.num_variants == 2
    layout, output, hits = _prefill_and_keep(craft, [EXTRA, CHUNKS[1]])
    assert [hit.tier for hit in hits] == ["miss", "variant"]
    (variant,) = craft.cache.variants.by_chunk[craft.cache.keys(layout.chunk_ids).chunks[1]][:1]
    cfo = hits[1].recompute_ratio
    # the prefix (CHUNKS[0]) is gone: beta = 0, so CFO = alpha x CCI
    assert cfo == pytest.approx(variant.stats.cci) and 0.5 <= cfo < 1.0
    start, end = layout.cu_segments[2], layout.cu_segments[3]
    recomputed = output.recomputed_positions
    in_chunk = recomputed[(recomputed >= start) & (recomputed < end)] - start
    num_expected = math.ceil(cfo * (end - start))
    assert in_chunk.numel() == num_expected
    assert set(in_chunk.tolist()) == set(variant.stats.ranking[:num_expected])


def test_a_variant_under_its_own_prefix_is_reused_exactly(craft):
    chunks = [CHUNKS[0], CHUNKS[1], CHUNKS[2]]
    _prefill_and_keep(craft, chunks)
    layout, output, hits = _prefill_and_keep(craft, chunks)
    assert [hit.tier for hit in hits] == ["variant"] * 3
    assert [hit.recompute_ratio for hit in hits] == [0.0] * 3
    assert output.num_recomputed_tokens == len(layout.query_ids)
    full = craft.engine.prefill(PrefillRequest(layout))
    torch.testing.assert_close(output.logits, full.logits, atol=1e-5, rtol=1e-5)


def test_pipeline_keeps_the_variant_budget(tiny_checkpoints, tiny_config):
    overrides = POLICIES["cachecraft"].overrides
    budget = {"enabled": True, "max_chunks": 1, "max_variants_per_chunk": 2}
    experimental = {**overrides["experimental"], "variants": budget}
    rag = AdaRAG(
        tiny_config(tiny_checkpoints["llama"], cache=overrides["cache"], experimental=experimental)
    )
    layout, _, _ = _prefill_and_keep(rag, [CHUNKS[0], CHUNKS[1], CHUNKS[2]])
    keys = rag.cache.keys(layout.chunk_ids)
    assert rag.cache.variants.num_variants == 2
    assert keys.chunks[0] not in rag.cache.variants.by_chunk  # the oldest, all scores equal
    _, _, hits = _prefill_and_keep(rag, [CHUNKS[0], CHUNKS[1], CHUNKS[2]])
    assert [hit.tier for hit in hits] == ["miss", "variant", "variant"]


def test_cachecraft_computes_something_else_than_cacheblend(craft, tiny_checkpoints, tiny_config):
    _prefill_and_keep(craft, [CHUNKS[0], CHUNKS[1], CHUNKS[2]])
    chunks = [EXTRA, CHUNKS[2], CHUNKS[1], CHUNKS[0]]
    _, craft_output, craft_hits = _prefill_and_keep(craft, chunks)
    blend_config = tiny_config(tiny_checkpoints["llama"], **POLICIES["cacheblend"].overrides)
    blend = AdaRAG(blend_config.model_copy(update={"home": blend_config.home / "blend"}))
    blend.warm(chunks)
    layout = blend.prompts.layout(QUESTION, chunks)
    blend_output, blend_hits, _ = blend.augmentation.fused_prefill(layout, 0)
    assert [hit.tier for hit in craft_hits] == ["miss", "variant", "variant", "variant"]
    assert {hit.recompute_ratio for hit in blend_hits} == {0.15}
    assert len({hit.recompute_ratio for hit in craft_hits[1:]}) > 1  # one CFO per variant
    assert not torch.equal(craft_output.recomputed_positions, blend_output.recomputed_positions)


def test_focused_chunks_follow_the_entropy_change_point():
    cumulative = [10.0, 1.0, 0.5, 0.4]
    gaps = [9.0, 0.5, 0.1]
    p = [gap / sum(gaps) for gap in gaps]
    terms = [-x * math.log(x) for x in p]
    change = terms.index(max(terms))
    expected = frozenset([0, 1, 2, 3][: change + 1])
    assert focused_chunks(cumulative) == expected
    # the same masses in another order: the same chunks, by their indices
    order = [1, 3, 2, 0]
    assert focused_chunks([0.4, 10.0, 0.5, 1.0]) == frozenset(order[: change + 1])
    assert focused_chunks([2.0, 2.0, 2.0]) == frozenset({0, 1, 2})  # no gap: all
    assert focused_chunks([3.0]) == frozenset({0})


def test_focus_tracker_waits_for_a_stable_set():
    tracker = FocusTracker(window=2, num_chunks=3)
    assert tracker.update([5.0, 0.1, 0.0]) is None  # one layer only
    assert tracker.update([5.0, 0.1, 0.0]) == focused_chunks([10.0, 0.2, 0.0])


def test_focus_window_stops_recomputing_unfocused_chunks(craft):
    _prefill_and_keep(craft, [CHUNKS[0], CHUNKS[1], CHUNKS[2]])
    chunks = [EXTRA, CHUNKS[0], CHUNKS[2], CHUNKS[1]]
    layout = craft.prompts.layout(QUESTION, chunks)
    plain, hits, _ = craft.augmentation.fused_prefill(layout, 0)
    assert plain.segment_attention is not None and plain.token_attention_positions is not None
    assert torch.equal(plain.token_attention_positions, plain.recomputed_positions)
    # with a window of one layer the set is final after the first layer
    query_mass = plain.segment_attention[0, -1, 1:-1].tolist()
    focused = focused_chunks(query_mass)
    cu = layout.cu_segments
    dropped = {
        position
        for idx, hit in enumerate(hits)
        if hit.tier == "variant" and idx not in focused
        for position in plain.recomputed_positions.tolist()
        if cu[idx + 1] <= position < cu[idx + 2]
    }
    assert dropped, "the prompt must leave a recomputed chunk out of focus"
    windowed = craft.with_config(experimental={"recompute": {"focus_window": 1}})
    output, _, _ = windowed.augmentation.fused_prefill(layout, 0)
    assert torch.equal(output.recomputed_positions, plain.recomputed_positions)
    final = set(output.token_attention_positions.tolist())
    assert final == set(plain.recomputed_positions.tolist()) - dropped
    assert not torch.allclose(output.logits, plain.logits)
