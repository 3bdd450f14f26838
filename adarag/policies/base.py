"""The policy type: a named set of configuration overrides, and helpers that write them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adarag.config import AdaRagConfig


@dataclass(frozen=True)
class Policy:
    """A named configuration preset: overrides over :class:`~adarag.config.AdaRagConfig`.

    What a policy must prepare follows from its overrides: :attr:`uses_independent_tier` (the
    ingest-time independent KV), :attr:`uses_fused_tier` (each chunk's fused KV computed at warm)
    and :attr:`augments` (chunks added one at a time); ``experimental.arrangement.reorder =
    "longest_prefix"`` asks for a batch to be scheduled (:meth:`adarag.AdaRAG.schedule`).
    """

    name: str
    description: str
    overrides: dict[str, Any]
    static_twin: str | None = None
    """For an augmenting policy, the policy that answers from the same top-k without stopping."""

    @property
    def uses_independent_tier(self) -> bool:
        """Whether ingest-time independent KV matters to this policy."""
        return bool(self.overrides["cache"]["independent"]["enabled"])

    @property
    def uses_fused_tier(self) -> bool:
        """Whether the policy needs each chunk's fused KV computed at warm (FusionRAG)."""
        fusion = self.overrides.get("experimental", {}).get("fusion", {})
        return bool(fusion.get("enabled", False))

    @property
    def augments(self) -> bool:
        """Whether the policy adds chunks one at a time."""
        return bool(self.overrides["augment"]["enabled"])

    def config(self, base: AdaRagConfig | None = None, **overrides: Any) -> AdaRagConfig:
        """``base`` (or defaults) under this policy's overrides, then ``overrides`` on top.

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        merged: dict[str, Any] = {}
        _merge(merged, self.overrides)
        _merge(merged, overrides)
        return AdaRagConfig.build(base, **merged)


def _merge(target: dict[str, Any], updates: Mapping[str, Any]) -> None:
    """Merge nested ``updates`` into ``target`` (sections merged key by key; new dicts copied)."""
    for key, value in updates.items():
        if isinstance(value, Mapping):
            section = target.get(key)
            if not isinstance(section, dict):
                section = target[key] = {}
            _merge(section, value)
        else:
            target[key] = value


def tiered(
    name: str,
    description: str,
    *,
    hard: bool,
    soft: bool,
    independent: bool,
    independent_ratio: float | None = None,
    selection: str | None = None,
    augment: bool = False,
    stop_rule: str | None = None,
    static_twin: str | None = None,
) -> Policy:
    """A policy from the tier and augmentation switches.

    A ratio, selection or stop rule left None keeps the configured default.
    """
    independent_tier: dict[str, Any] = {"enabled": independent}
    if independent_ratio is not None:
        independent_tier["recompute_ratio"] = independent_ratio
    cache: dict[str, Any] = {
        "hard": {"enabled": hard},
        "soft": {"enabled": soft},
        "independent": independent_tier,
    }
    if selection is not None:
        cache["recompute"] = {"selection_policy": selection}
    augmentation: dict[str, Any] = {"enabled": augment}
    if stop_rule is not None:
        augmentation["stop_rule"] = stop_rule
    overrides = {"cache": cache, "augment": augmentation}
    return Policy(name, description, overrides, static_twin)


def with_experimental(policy: Policy, **experimental: dict[str, Any]) -> Policy:
    """``policy`` with sections of ``experimental`` overridden (a strategy's levers)."""
    overrides: dict[str, Any] = {}
    _merge(overrides, policy.overrides)
    _merge(overrides, {"experimental": experimental})
    return Policy(policy.name, policy.description, overrides, policy.static_twin)
