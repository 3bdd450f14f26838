"""``cachecraft`` (Cache-Craft).

Every chunk computed in full is kept as a variant with its attention statistics (N x M = 100 x
5); a later prompt reuses the variant with the lowest cache-fix overhead and recomputes
ceil(CFO x tokens) of its tokens, ranked when it was stored; the variant with the lowest
frequency-reusability score is evicted when the budget is full; the tokens of chunks the question
does not focus on stop being recomputed once the focused set has held for 5 layers (the paper
gives no window).
"""

from __future__ import annotations

from adarag.policies.base import tiered, with_experimental

PRESETS = (
    with_experimental(
        tiered(
            "cachecraft",
            "chunk variants (100 x 5) reused by lowest CFO, ceil(CFO x tokens) recomputed by "
            "stored rank, frequency-reusability eviction",
            hard=False,
            soft=False,
            independent=False,
            selection="stored_rank",
        ),
        recompute={"budget": "per_chunk", "focus_window": 5},
        variants={"enabled": True, "max_chunks": 100, "max_variants_per_chunk": 5, "alpha": 1.0},
    ),
)
