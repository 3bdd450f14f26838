"""``a3`` (A3).

Independent chunk KV, re-positioned, with 15% of the chunk tokens recomputed, chosen by the
attention the question pays them at layer 1 (one global budget over all chunks).

Differences from the paper: our question runs over the *cached* layer-0 KV to reach layer 1 (A3
recomputes block 0 for the whole prompt first), scores are per-head softmax mass averaged over
heads (the unreleased A3 code may concatenate heads) with no pooling of neighbouring scores, keys
are stored after RoPE and rotated to their new positions (A3 stores them before RoPE; the result
is the same up to rounding), and chunks are precomputed after the system prompt (A3: alone after
BOS).
"""

from __future__ import annotations

from adarag.policies.base import Policy

PRESETS = (
    Policy(
        "a3",
        "A3: independent KV + 15% recomputation by the question's attention at layer 1",
        {
            "cache": {
                "hard": {"enabled": False},
                "soft": {"enabled": False},
                "independent": {"enabled": True, "recompute_ratio": 0.15},
                "recompute": {"selection_policy": "query_attention"},
            },
            "augment": {"enabled": False},
            "experimental": {
                "recompute": {"query_layers": (1, 2), "budget": "global", "max_chunk_ratio": None}
            },
        },
    ),
)
