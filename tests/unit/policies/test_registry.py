"""The policy registry: a preset is one module plus one registry line, and serves a pipeline."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap

import pytest

import adarag.policies
from adarag import AdaRAG, AdaRagConfig, ConfigError
from adarag.policies import POLICIES, Policy, get_policy, policy_config, register, unregister
from adarag.policies.registry import PRESET_MODULES

EXAMPLE = '''
"""``example``: the soft tier alone, 5% recomputed."""

from adarag.policies import tiered

PRESETS = (
    tiered("example", "soft tier only", hard=False, soft=True, independent=False),
)
'''


@pytest.fixture()
def example_module(tmp_path, monkeypatch):
    """A preset module written to a temporary package, as a new preset would be."""
    package = tmp_path / "example_presets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "example.py").write_text(textwrap.dedent(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("example_presets.example")
    yield module
    sys.modules.pop("example_presets.example", None)
    sys.modules.pop("example_presets", None)


def test_a_new_preset_is_one_module_and_one_register_call(example_module):
    assert "example" not in POLICIES
    register(example_module.PRESETS)  # what a line in PRESET_MODULES does at import
    try:
        config = policy_config("example")
        assert config.cache.soft.enabled
        assert not config.cache.hard.enabled and not config.cache.independent.enabled
        rag = AdaRAG.from_policy("example")  # the engine loads on first use, not here
        assert rag.config == config
    finally:
        unregister("example")
    assert "example" not in POLICIES
    with pytest.raises(ConfigError, match="unknown policy 'example'"):
        policy_config("example")


def test_every_preset_module_is_listed_in_the_registry():
    skip = {"base", "registry"}
    modules = {
        info.name
        for info in pkgutil.iter_modules(adarag.policies.__path__)
        if info.name not in skip
    }
    assert modules == {module.__name__.rpartition(".")[2] for module in PRESET_MODULES}
    registered = [policy.name for module in PRESET_MODULES for policy in module.PRESETS]
    assert registered == list(POLICIES)  # no preset registered twice, none outside a module


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_registered_policy_builds_a_valid_configuration(name):
    policy = get_policy(name)
    config = policy_config(name)
    assert config == AdaRagConfig.build(**policy.overrides)
    assert config.cache.independent.enabled == policy.uses_independent_tier
    assert config.experimental.fusion.enabled == policy.uses_fused_tier
    assert config.augment.enabled == policy.augments
    if policy.static_twin is not None:
        assert not get_policy(policy.static_twin).augments


def test_from_policy_applies_overrides_over_the_preset():
    rag = AdaRAG.from_policy("cacheblend", cache={"independent": {"recompute_ratio": 0.3}})
    cache = rag.config.cache
    assert cache.independent.enabled and cache.independent.recompute_ratio == 0.3
    assert cache.recompute.selection_policy == "kv_deviation"  # the preset's, kept
    base = AdaRagConfig.build(retrieval={"top_k": 7})
    assert AdaRAG.from_policy("prefix", base).config.retrieval.top_k == 7
    assert get_policy("cacheblend").overrides["cache"]["independent"]["recompute_ratio"] == 0.15


def test_from_policy_with_an_unknown_name_lists_the_known_policies():
    with pytest.raises(ConfigError, match="unknown policy 'nope'") as caught:
        AdaRAG.from_policy("nope")
    assert all(name in str(caught.value) for name in POLICIES)


def test_register_refuses_a_duplicate_name_and_an_unknown_static_twin():
    with pytest.raises(ConfigError, match="already registered"):
        register(get_policy("full"))
    twinless = Policy("lonely", "", {"cache": {}, "augment": {"enabled": True}}, "missing")
    with pytest.raises(ConfigError, match="static_twin 'missing'"):
        register(twinless)
    assert "lonely" not in POLICIES
