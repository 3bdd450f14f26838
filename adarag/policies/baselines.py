"""The baselines of the AdaCache paper's comparisons (section 4.1 and Figure 6).

- ``full``: full recomputation, nothing reused;
- ``prefix``: prefix caching -- exact-prefix (hard) reuse only, otherwise full compute;
- ``promptcache``: independent chunk KV, no recomputation (PromptCache);
- ``cacheblend``: independent chunk KV with a uniform 15% recomputation chosen by V deviation at
  the second layer (CacheBlend).
"""

from __future__ import annotations

from adarag.policies.base import tiered

PRESETS = (
    tiered("full", "full recomputation", hard=False, soft=False, independent=False),
    tiered(
        "prefix", "prefix caching (exact prefix only)", hard=True, soft=False, independent=False
    ),
    tiered(
        "promptcache",
        "independent chunk KV, no recomputation",
        hard=False,
        soft=False,
        independent=True,
        independent_ratio=0.0,
    ),
    tiered(
        "cacheblend",
        "independent KV + 15% recomputation by V deviation",
        hard=False,
        soft=False,
        independent=True,
        independent_ratio=0.15,
        selection="kv_deviation",
    ),
)
