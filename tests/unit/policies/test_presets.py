"""The named policies: each builds a valid configuration, and the related systems really differ."""

from __future__ import annotations

import pytest

from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.policies import POLICIES
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_builds_a_valid_configuration(name):
    AdaRagConfig.build(**POLICIES[name].overrides)


def test_ragboost_is_lossless_hard_tier_reuse_with_reordering_and_deduplication():
    config = AdaRagConfig.build(**POLICIES["ragboost"].overrides)
    cache = config.cache
    assert cache.hard.enabled and not cache.soft.enabled and not cache.independent.enabled
    arrangement = config.experimental.arrangement
    assert arrangement.reorder == "longest_prefix" and arrangement.deduplicate


def test_a3_selects_other_tokens_than_cacheblend_on_the_same_prompt(tiny_checkpoints, tiny_config):
    configs = {
        name: AdaRagConfig.build(tiny_config(tiny_checkpoints["llama"]), **POLICIES[name].overrides)
        for name in ("a3", "cacheblend")
    }
    engine = load_engine(configs["a3"])
    layout = layout_of(engine, QUESTION, CHUNKS)
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    chosen = {}
    for name, config in configs.items():
        ratio = config.cache.independent.recompute_ratio
        assert ratio == 0.15
        sources = reuse_sources(system_kv, chunk_kvs, ratio)
        output = engine.prefill(PrefillRequest(layout, sources, selection=config.selection))
        chosen[name] = set(output.recomputed_positions.tolist())
    assert len(chosen["a3"]) == len(chosen["cacheblend"])  # the same budget
    assert chosen["a3"] != chosen["cacheblend"]
    a3 = configs["a3"].selection
    assert a3.selection_policy == "query_attention" and a3.query_layers == (1, 2)
