"""The caching policies the benchmark compares, each a set of configuration overrides.

Baselines follow the AdaCache paper's comparisons (section 4.1 and Figure 6):

- ``full``: full recomputation, nothing reused;
- ``prefix``: prefix caching -- exact-prefix (hard) reuse only, otherwise full compute;
- ``promptcache``: independent chunk KV, no recomputation (PromptCache);
- ``cacheblend``: independent chunk KV with a uniform 15% recomputation chosen by V deviation at
  the second layer (CacheBlend);
- ``adacache-static``: AdaCache's tiers with the default selection, static top-k;
- ``adacache``: tiers and adaptive context augmentation (the agreement stop rule, the default);
- ``adacache-confidence``: the same with the lens-confidence stop rule;
- ``prefix+aca`` and ``cacheblend+aca``: augmentation on top of the two baselines.

Related chunk-KV reuse systems, each built from its own mechanism:

- ``fusionrag`` (FusionRAG): at warm, each chunk's KV computed after its 10 most similar chunks
  (one fused entry per chunk); exact-prefix hits, then the alternative path (the chunk under a
  shorter run of the chunks before it), then the fused entry; 15% of the reused tokens recomputed,
  chosen globally by the question's final-layer attention;
- ``cachecraft`` (Cache-Craft): every chunk computed in full is kept as a variant with its
  attention statistics (N x M = 100 x 5); a later prompt reuses the variant with the lowest
  cache-fix overhead and recomputes ceil(CFO x tokens) of its tokens, ranked when it was stored;
  the variant with the lowest frequency-reusability score is evicted when the budget is full;
  the tokens of chunks the question does not focus on stop being recomputed once the focused set
  has held for 5 layers (the paper gives no window);
- ``ragboost`` (RAGBoost): lossless prompt-level reuse over the exact hard tier -- chunks listed
  to hit the longest cached prefix (the context index) with an order hint giving the retriever's
  ranking, a batch scheduled so prefix-sharing requests run back to back, and multi-turn
  de-duplication with location hints. Nothing is recomputed approximately.
- ``a3`` (A3): independent chunk KV, re-positioned, with 15% of the chunk tokens recomputed,
  chosen by the attention the question pays them at layer 1 (one global budget over all chunks).
  Differences from the paper: our question runs over the *cached* layer-0 KV to reach layer 1
  (A3 recomputes block 0 for the whole prompt first), scores are per-head softmax mass averaged
  over heads (the unreleased A3 code may concatenate heads) with no pooling of neighbouring
  scores, keys are stored after RoPE and rotated to their new positions (A3 stores them before
  RoPE; the result is the same up to rounding), and chunks are precomputed after the system
  prompt (A3: alone after BOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Policy:
    """A named configuration to benchmark."""

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
        return bool(self.overrides["cache"].get("fusion", {}).get("enabled", False))

    @property
    def augments(self) -> bool:
        """Whether the policy adds chunks one at a time."""
        return bool(self.overrides["augment"]["enabled"])


def _policy(
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
    """A policy's overrides; a ratio or selection left None keeps the configured default."""
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


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        _policy("full", "full recomputation", hard=False, soft=False, independent=False),
        _policy(
            "prefix", "prefix caching (exact prefix only)", hard=True, soft=False, independent=False
        ),
        _policy(
            "promptcache",
            "independent chunk KV, no recomputation",
            hard=False,
            soft=False,
            independent=True,
            independent_ratio=0.0,
        ),
        _policy(
            "cacheblend",
            "independent KV + 15% recomputation by V deviation",
            hard=False,
            soft=False,
            independent=True,
            independent_ratio=0.15,
            selection="kv_deviation",
        ),
        _policy(
            "adacache-static",
            "AdaCache tiers, static top-k",
            hard=True,
            soft=True,
            independent=True,
        ),
        _policy(
            "adacache",
            "AdaCache tiers + adaptive augmentation",
            hard=True,
            soft=True,
            independent=True,
            augment=True,
            static_twin="adacache-static",
        ),
        _policy(
            "adacache-confidence",
            "AdaCache tiers + augmentation stopped by the lens confidence alone",
            hard=True,
            soft=True,
            independent=True,
            augment=True,
            stop_rule="confidence",
            static_twin="adacache-static",
        ),
        _policy(
            "prefix+aca",
            "prefix caching + adaptive augmentation",
            hard=True,
            soft=False,
            independent=False,
            augment=True,
            static_twin="prefix",
        ),
        _policy(
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
}


def _with_cache(policy: Policy, **cache: dict[str, Any]) -> Policy:
    """``policy`` with more cache sections overridden."""
    overrides = {**policy.overrides, "cache": {**policy.overrides["cache"], **cache}}
    return Policy(policy.name, policy.description, overrides, policy.static_twin)


POLICIES["fusionrag"] = _with_cache(
    _policy(
        "fusionrag",
        "fused KV (10 similar chunks before each) + alternative path + 15% by final-layer "
        "query attention",
        hard=True,
        soft=False,
        independent=True,
        independent_ratio=0.15,
    ),
    recompute={
        "selection_policy": "query_attention",
        "query_last_layers": 1,
        "budget": "global",
    },
    alternative_path={"enabled": True, "recompute_ratio": 0.15},
    fusion={"enabled": True, "num_neighbors": 10, "recompute_ratio": 0.15},
)
POLICIES["cachecraft"] = _with_cache(
    _policy(
        "cachecraft",
        "chunk variants (100 x 5) reused by lowest CFO, ceil(CFO x tokens) recomputed by "
        "stored rank, frequency-reusability eviction",
        hard=False,
        soft=False,
        independent=False,
    ),
    recompute={"selection_policy": "stored_rank", "budget": "per_chunk", "focus_window": 5},
    variants={"enabled": True, "max_chunks": 100, "max_variants_per_chunk": 5, "alpha": 1.0},
)
POLICIES["ragboost"] = Policy(
    "ragboost",
    "RAGBoost: longest cached prefix + order hint + scheduling + multi-turn de-duplication",
    {
        "cache": {
            "hard": {"enabled": True},
            "soft": {"enabled": False},
            "independent": {"enabled": False},
            "reorder": "longest_prefix",
        },
        "augment": {"enabled": False},
        "chat": {"deduplicate": True},
    },
)

POLICIES["a3"] = Policy(
    "a3",
    "A3: independent KV + 15% recomputation by the question's attention at layer 1",
    {
        "cache": {
            "hard": {"enabled": False},
            "soft": {"enabled": False},
            "independent": {"enabled": True, "recompute_ratio": 0.15},
            "recompute": {
                "selection_policy": "query_attention",
                "query_layers": (1, 2),
                "budget": "global",
                "max_chunk_ratio": None,
            },
        },
        "augment": {"enabled": False},
    },
)
