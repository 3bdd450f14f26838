"""The registry of named policies: every preset module's ``PRESETS``, in the order listed.

Adding a preset is one module (``PRESETS = (Policy(...), ...)``) and one line in
``PRESET_MODULES``; :func:`register` adds a policy at runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adarag.config import AdaRagConfig
from adarag.errors import ConfigError
from adarag.policies import a3, adacache, baselines, cachecraft, fusionrag, ragboost
from adarag.policies.base import Policy

PRESET_MODULES = (
    baselines,
    adacache,
    fusionrag,
    cachecraft,
    ragboost,
    a3,
)

POLICIES: dict[str, Policy] = {}
"""Every registered policy by name; ``adarag bench --policies`` and the benchmarks pick from it."""


def register(policies: Policy | Iterable[Policy], *, replace: bool = False) -> None:
    """Add policies to :data:`POLICIES`.

    Args:
        policies: A policy or several.
        replace: Allow a name already registered to be replaced.

    Raises:
        ConfigError: A name is already registered (and ``replace`` is False), or a policy's
            ``static_twin`` names no registered policy.
    """
    batch = [policies] if isinstance(policies, Policy) else list(policies)
    names = {policy.name for policy in batch}
    for policy in batch:
        if policy.name in POLICIES and not replace:
            raise ConfigError(
                f"policy {policy.name!r} is already registered; pick another name or pass "
                "replace=True"
            )
        twin = policy.static_twin
        if twin is not None and twin not in POLICIES and twin not in names:
            raise ConfigError(
                f"policy {policy.name!r} names static_twin {twin!r}, which is not registered; "
                f"known policies: {', '.join(sorted(POLICIES))}"
            )
    for policy in batch:
        POLICIES[policy.name] = policy


def unregister(name: str) -> Policy:
    """Remove a policy from :data:`POLICIES` and return it.

    Raises:
        ConfigError: No policy has that name.
    """
    policy = get_policy(name)
    del POLICIES[name]
    return policy


def get_policy(name: str) -> Policy:
    """The registered policy called ``name``.

    Raises:
        ConfigError: No policy has that name; the message lists the known ones.
    """
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown policy {name!r}; known policies: {', '.join(POLICIES)}"
        ) from None


def policy_config(name: str, base: AdaRagConfig | None = None, **overrides: Any) -> AdaRagConfig:
    """``base`` (or defaults) under the policy ``name``, with ``overrides`` applied on top.

    This is what :meth:`adarag.AdaRAG.from_policy` builds its configuration with.

    Raises:
        ConfigError: No policy has that name, or an override is invalid.
    """
    return get_policy(name).config(base, **overrides)


for _module in PRESET_MODULES:
    register(_module.PRESETS)
