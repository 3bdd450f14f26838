"""Named policies: presets of configuration overrides (AdaCache, the baselines, related systems).

Serve one with :meth:`adarag.AdaRAG.from_policy`; ``adarag bench --policies`` (``--workload``:
every policy side by side) compares them. Each preset family has its own module (``baselines``,
``adacache``, ``fusionrag``, ``cachecraft``, ``ragboost``, ``a3``) whose ``PRESETS`` the registry
(``registry.PRESET_MODULES``) collects.
"""

from __future__ import annotations

from adarag.policies.base import Policy, tiered, with_experimental
from adarag.policies.registry import (
    POLICIES,
    get_policy,
    policy_config,
    register,
    unregister,
)

__all__ = [
    "POLICIES",
    "Policy",
    "get_policy",
    "policy_config",
    "register",
    "tiered",
    "unregister",
    "with_experimental",
]
