"""``fusionrag`` (FusionRAG).

At warm, each chunk's KV computed after its 10 most similar chunks (one fused entry per chunk);
exact-prefix hits, then the alternative path (the chunk under a shorter run of the chunks before
it), then the fused entry; 15% of the reused tokens recomputed, chosen globally by the question's
final-layer attention.
"""

from __future__ import annotations

from adarag.policies.base import tiered, with_experimental

PRESETS = (
    with_experimental(
        tiered(
            "fusionrag",
            "fused KV (10 similar chunks before each) + alternative path + 15% by final-layer "
            "query attention",
            hard=True,
            soft=False,
            independent=True,
            independent_ratio=0.15,
            selection="query_attention",
        ),
        recompute={"query_last_layers": 1, "budget": "global"},
        alternative_path={"enabled": True, "recompute_ratio": 0.15},
        fusion={"enabled": True, "num_neighbors": 10, "recompute_ratio": 0.15},
    ),
)
