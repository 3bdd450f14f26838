"""AdaCache: its tiers, and adaptive context augmentation (also over two baselines).

- ``adacache-static``: AdaCache's tiers with the default selection, static top-k;
- ``adacache``: tiers and adaptive context augmentation (the agreement stop rule, the default);
- ``adacache-confidence``: the same with the lens-confidence stop rule;
- ``prefix+aca`` and ``cacheblend+aca``: augmentation on top of the two baselines.
"""

from __future__ import annotations

from adarag.policies.base import tiered

PRESETS = (
    tiered(
        "adacache-static",
        "AdaCache tiers, static top-k",
        hard=True,
        soft=True,
        independent=True,
    ),
    tiered(
        "adacache",
        "AdaCache tiers + adaptive augmentation",
        hard=True,
        soft=True,
        independent=True,
        augment=True,
        static_twin="adacache-static",
    ),
    tiered(
        "adacache-confidence",
        "AdaCache tiers + augmentation stopped by the lens confidence alone",
        hard=True,
        soft=True,
        independent=True,
        augment=True,
        stop_rule="confidence",
        static_twin="adacache-static",
    ),
    tiered(
        "prefix+aca",
        "prefix caching + adaptive augmentation",
        hard=True,
        soft=False,
        independent=False,
        augment=True,
        static_twin="prefix",
    ),
    tiered(
        "cacheblend+aca",
        "CacheBlend + adaptive augmentation",
        hard=False,
        soft=False,
        independent=True,
        independent_ratio=0.15,
        selection="kv_deviation",
        augment=True,
        static_twin="cacheblend",
    ),
)
