"""The chunk-KV cache: its tiers, the recomputation rule and the store."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from adarag.config.base import _Frozen
from adarag.config.recompute import RecomputeSettings
from adarag.config.store import StoreConfig


class HardTierConfig(_Frozen):
    """The hard tier: exact prefixes, reused as they are (nothing recomputed)."""

    enabled: bool = Field(default=True, description="Look this tier up.")

    @model_validator(mode="before")
    @classmethod
    def _drop_fixed_ratio(cls, data: Any) -> Any:
        if isinstance(data, dict) and "recompute_ratio" in data:
            if data["recompute_ratio"] != 0:
                raise ValueError(
                    "the hard tier reuses KV as is: remove hard.recompute_ratio (it is always 0)"
                )
            data = {key: value for key, value in data.items() if key != "recompute_ratio"}
        return data


class TierConfig(_Frozen):
    """One cache tier: whether it is used and the recomputation ratio of a hit."""

    enabled: bool = Field(default=True, description="Look this tier up.")
    recompute_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Fraction of a hit chunk's tokens recomputed."
    )


class CacheConfig(_Frozen):
    """The three-tier chunk-KV cache (AdaCache section 3.1)."""

    hard: HardTierConfig = Field(default_factory=HardTierConfig)
    soft: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.1))
    independent: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.2))
    recompute: RecomputeSettings = Field(default_factory=RecomputeSettings)
    store: StoreConfig = Field(default_factory=StoreConfig)
