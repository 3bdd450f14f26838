"""``ragboost`` (RAGBoost).

Lossless prompt-level reuse over the exact hard tier: chunks listed to hit the longest cached
prefix (the context index) with an order hint giving the retriever's ranking, a batch scheduled
so prefix-sharing requests run back to back, and multi-turn de-duplication with location hints.
Nothing is recomputed approximately.
"""

from __future__ import annotations

from adarag.policies.base import Policy

PRESETS = (
    Policy(
        "ragboost",
        "RAGBoost: longest cached prefix + order hint + scheduling + multi-turn de-duplication",
        {
            "cache": {
                "hard": {"enabled": True},
                "soft": {"enabled": False},
                "independent": {"enabled": False},
            },
            "augment": {"enabled": False},
            "experimental": {"arrangement": {"reorder": "longest_prefix", "deduplicate": True}},
        },
    ),
)
