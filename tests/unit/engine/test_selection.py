"""Selection rules travel with the request, really differ, and respect their budgets."""

from __future__ import annotations

import itertools
import math
import typing

import pytest
import torch

from adarag import AdaRAG
from adarag.config import RecomputeConfig
from adarag.engine.batch import SegmentPlan
from adarag.engine.prefill_request import OracleInputs, PrefillRequest
from adarag.engine.selection import RecomputePlan, key_attention_mass
from adarag.engine.selection_rules import SELECTION_RULES
from adarag.errors import InputError
from adarag.kv import ChunkKV
from tests.unit.engine.helpers import (
    CHUNKS,
    QUESTION,
    independent_sources,
    layout_of,
    load_engine,
)

RULES = [
    "cross_attention",
    "kv_deviation",
    "query_attention",
    "query_deviation",
    "random",
    "oracle",
]


@pytest.fixture()
def engine(tiny_checkpoints, tiny_config):
    return load_engine(tiny_config(tiny_checkpoints["llama"]))


def _recomputed(engine, layout, sources, rule, **knobs):
    reference = engine.prefill(PrefillRequest(layout)).kv
    selection = RecomputeConfig(selection_policy=rule, **knobs)
    output = engine.prefill(
        PrefillRequest(
            layout, sources, selection=selection, oracle=OracleInputs(reference_kv=reference)
        )
    )
    return tuple(output.recomputed_positions.tolist())


def test_every_rule_recomputes_different_positions_at_one_ratio(engine):
    """Issue 12: two selection policies at one ratio must not compute the same thing."""
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    chosen = {rule: _recomputed(engine, layout, sources, rule) for rule in RULES}
    for first, second in itertools.combinations(RULES, 2):
        assert chosen[first] != chosen[second], f"{first} and {second} chose the same tokens"
    assert len({len(positions) for positions in chosen.values()}) == 1  # one budget


def test_query_layers_change_what_query_deviation_recomputes(engine):
    """The query's attention read in the upper layers only is another rule, not a relabel."""
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    num_layers = engine.spec.num_layers
    every_layer = _recomputed(engine, layout, sources, "query_deviation")
    upper = _recomputed(
        engine, layout, sources, "query_deviation", query_layers=(num_layers - 1, num_layers)
    )
    assert len(upper) == len(every_layer) and upper != every_layer


def test_with_config_pipeline_recomputes_with_its_own_selection_rule(tiny_checkpoints, tiny_config):
    """Issue 20: a pipeline made by with_config must not run the base pipeline's rule."""
    rag = AdaRAG(
        tiny_config(tiny_checkpoints["llama"], cache={"independent": {"recompute_ratio": 0.3}})
    )
    rag.warm(list(CHUNKS))
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    other = rag.with_config(cache={"recompute": {"selection_policy": "cross_attention"}})
    assert other.engine is rag.engine
    base_output, base_hits, _ = rag.augmentation.fused_prefill(layout, 0)
    other_output, other_hits, _ = other.augmentation.fused_prefill(layout, 0)
    # the first chunk's independent KV is also its exact KV after the system prefix (hard)
    expected = ["hard", "independent", "independent"]
    assert [hit.tier for hit in base_hits] == [hit.tier for hit in other_hits] == expected
    assert base_output.num_recomputed_tokens == other_output.num_recomputed_tokens
    assert not torch.equal(base_output.recomputed_positions, other_output.recomputed_positions)


def test_random_rule_follows_its_seed(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    first = _recomputed(engine, layout, sources, "random", seed=1)
    assert _recomputed(engine, layout, sources, "random", seed=1) == first
    assert _recomputed(engine, layout, sources, "random", seed=2) != first


def test_oracle_without_a_reference_is_a_clear_error(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    with pytest.raises(InputError, match="oracle.*reference"):
        engine.prefill(
            PrefillRequest(layout, sources, selection=RecomputeConfig(selection_policy="oracle"))
        )


def test_query_layers_outside_the_model_are_a_clear_error(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.3)
    selection = RecomputeConfig(selection_policy="query_attention", query_layers=(1, 5))
    with pytest.raises(InputError, match="query_layers"):
        engine.prefill(PrefillRequest(layout, sources, selection=selection))


def test_global_budget_keeps_the_total_and_the_cap(engine):
    layout = layout_of(engine, QUESTION, CHUNKS)
    sources, _, _ = independent_sources(engine, layout, ratio=0.2)
    per_chunk = _recomputed(engine, layout, sources, "query_attention")
    pooled = _recomputed(engine, layout, sources, "query_attention", budget="global")
    assert len(per_chunk) == len(pooled)
    capped = _recomputed(
        engine, layout, sources, "query_attention", budget="global", max_chunk_ratio=0.25
    )
    cu = layout.cu_segments
    for idx, ids in enumerate(layout.chunk_ids):
        in_chunk = sum(cu[idx + 1] <= p < cu[idx + 2] for p in capped)
        assert in_chunk <= max(math.ceil(0.25 * len(ids)), math.ceil(0.2 * len(ids)))


def _plan(lengths, ratios):
    """A plan over segments of ``lengths``; a ratio of None computes that segment in full."""
    segments, start = [], 0
    for length, ratio in zip(lengths, ratios, strict=True):
        cached = None if ratio is None else ChunkKV(*torch.zeros(2, 1, length, 1, 1), start)
        segments.append(SegmentPlan(start, start + length, cached, ratio or 0.0))
        start += length
    return RecomputePlan.of(segments)


def test_plan_budgets_and_tie_break_towards_earlier_positions():
    plan = _plan([2, 4, 4, 3], [None, 0.5, 0.25, None])  # system, two chunks, query
    assert plan.always.tolist() == [0, 1, 10, 11, 12]
    assert plan.candidates.tolist() == list(range(2, 10))
    assert plan.budgets == (0, 2, 1, 0)
    flat = torch.zeros(8)
    per_chunk = RecomputeConfig(budget="per_chunk")
    assert plan.choose(flat, per_chunk).tolist() == [2, 3, 6]
    scores = torch.tensor([0.1, 0.9, 0.2, 0.8, 5.0, 4.0, 0.0, 0.0])
    assert plan.choose(scores, per_chunk).tolist() == [3, 5, 6]
    pooled = plan.choose(scores, RecomputeConfig(budget="global"))
    assert pooled.tolist() == [3, 6, 7]  # the best three of all candidates
    capped = plan.choose(scores, RecomputeConfig(budget="global", max_chunk_ratio=0.25))
    assert capped.tolist() == [3, 5, 6]  # one of the second chunk; then the first chunk's best


def test_key_attention_mass_sums_to_one_per_query_and_never_looks_ahead():
    torch.manual_seed(0)
    q, k = torch.randn(3, 4, 8), torch.randn(12, 2, 8)
    positions = torch.tensor([5, 7, 9])
    mass = key_attention_mass(q, k, positions, 8**-0.5)
    assert mass.sum().item() == pytest.approx(3.0, rel=1e-5)
    assert torch.all(mass[:10] > 0) and torch.all(mass[10:] == 0)
    only_first = key_attention_mass(q[:1], k, positions[:1], 8**-0.5)
    assert torch.all(only_first[6:] == 0)


def test_key_attention_mass_matches_per_head_softmax():
    torch.manual_seed(1)
    q, k = torch.randn(4, 6, 8), torch.randn(9, 2, 8)  # 3 query heads per KV head
    positions = torch.tensor([3, 5, 6, 8])
    expected = torch.zeros(9)
    for head in range(6):
        logits = q[:, head] @ k[:, head // 3].T * 0.5
        logits[torch.arange(9)[None, :] > positions[:, None]] = -math.inf
        expected += logits.softmax(dim=-1).sum(dim=0) / 6
    torch.testing.assert_close(key_attention_mass(q, k, positions, 0.5), expected)


def test_every_selection_policy_has_one_registered_rule():
    annotation = RecomputeConfig.model_fields["selection_policy"].annotation
    names = [name for literal in typing.get_args(annotation) for name in typing.get_args(literal)]
    assert sorted(SELECTION_RULES) == sorted(names)


def test_rules_declare_where_they_score_and_what_they_read():
    config = RecomputeConfig(deviation_check_layer=1)
    layers = {name: rule.scoring_layer(config) for name, rule in SELECTION_RULES.items()}
    at_a_layer = {"cross_attention": 0, "kv_deviation": 1, "query_deviation": 1, "learned": 1}
    assert layers == {name: at_a_layer.get(name) for name in SELECTION_RULES}
    reads_query = {n for n, rule in SELECTION_RULES.items() if rule.needs_query_attention}
    assert reads_query == {"query_attention", "query_deviation", "learned"}
    reads_layers = {n for n, rule in SELECTION_RULES.items() if rule.needs_layer_attention}
    assert reads_layers == {"learned"}
    reads_cached = {n for n, rule in SELECTION_RULES.items() if rule.reads_cached_values}
    assert reads_cached == {"kv_deviation", "query_deviation", "learned"}
