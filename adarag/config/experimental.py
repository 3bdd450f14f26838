"""The ``experimental`` section: levers from the literature that are off or fixed by default.

They reproduce and ablate the related systems the framework hosts (FusionRAG's offline fusion
and alternative path, Cache-Craft's chunk variants, RAGBoost's arrangement, CacheBlend's and
others' selection levers) and the stop rules' inner settings; the policies of
:mod:`adarag.policies` and the benchmarks set them. A setting that lived in another section
before moves here with a warning that names its new key (:data:`MOVED`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from adarag.config.augment import AugmentLevers
from adarag.config.base import _deep_update, _Frozen
from adarag.config.cache import TierConfig
from adarag.config.prompt import _RESERVED_PROMPT_CHARACTERS
from adarag.config.recompute import RecomputeLevers

logger = logging.getLogger(__name__)


class FusionConfig(_Frozen):
    """FusionRAG's offline fusion: each chunk's KV computed after its most similar chunks."""

    enabled: bool = Field(
        default=False,
        description="At warm, also store each chunk's KV computed after the independent KV of "
        "its num_neighbors most similar chunks (the retriever's ranking with the chunk as the "
        "query), one fused entry per chunk; lookups prefer it to the independent entry.",
    )
    num_neighbors: int = Field(
        default=10, ge=1, le=64, description="Similar chunks placed before a chunk (paper: 10)."
    )
    recompute_ratio: float = Field(
        default=0.15, ge=0.0, le=1.0, description="Fraction of a fused hit's tokens recomputed."
    )
    min_neighbors_in_prompt: int = Field(
        default=0,
        ge=0,
        le=64,
        description="A chunk reuses its fused entry only when at least this many of the chunks "
        "it was computed after are in the prompt too (its independent entry otherwise): a fused "
        "entry whose neighbours are absent carries context the prompt does not have. 0: always.",
    )


class VariantConfig(_Frozen):
    """Cache-Craft's chunk variants: KV of a chunk under several prefixes, reused by CFO."""

    enabled: bool = Field(
        default=False,
        description="Keep each chunk computed in full as a variant (its KV, the chunks before "
        "it, their attention statistics and its tokens' ranking); a later prompt reuses the "
        "variant with the lowest cache-fix overhead CFO = alpha x CCI x (1 - beta') and "
        "recomputes ceil(CFO x tokens) of its best-ranked tokens.",
    )
    max_chunks: int = Field(
        default=100, ge=1, description="N of the N x M variant budget (paper: 100)."
    )
    max_variants_per_chunk: int = Field(
        default=5, ge=1, description="M of the N x M variant budget (paper: 5)."
    )
    alpha: float = Field(
        default=1.0, gt=0.0, le=8.0, description="CFO scale alpha (paper's ablation: 0.5-3)."
    )

    @property
    def max_variants(self) -> int:
        """The whole budget, N x M variants."""
        return self.max_chunks * self.max_variants_per_chunk


class ArrangementConfig(_Frozen):
    """RAGBoost's arrangement of a request's chunks and the order hint that goes with it."""

    reorder: Literal["none", "longest_prefix"] = Field(
        default="none",
        description="'longest_prefix' (RAGBoost): list a request's chunks so that the longest "
        "chunk sequence already cached in the hard tier comes first, the rest in the retriever's "
        "order, and say the retriever's ranking in order_hint; lossless, as hard hits "
        "are exact. 'none': the retriever's order.",
    )
    deduplicate: bool = Field(
        default=False,
        description="Keep the conversation's earlier chunks as the start of the context (a hard "
        "prefix of the previous turn) and add only the new turn's chunks not already in it; a "
        "chunk retrieved again is named by location in the order hint (RAGBoost's de-duplication)"
        ". False: each turn's context is its own retrieval.",
    )
    location_hint: str = Field(
        default="[{position}] (above)",
        description="How the order hint names a passage an earlier turn already brought; "
        "'{position}' becomes its number.",
    )
    order_hint: str = Field(
        default="The passages are not listed by relevance; by relevance they are: {ranking}.\n",
        description="Put before the question when the chunks are not in the retriever's order "
        "(reorder, deduplicate); '{ranking}' becomes the passages' numbers in the "
        "order listed, best first, e.g. '[3], [1], [2]' (RAGBoost's order hint).",
    )

    @model_validator(mode="after")
    def _check_templates(self) -> ArrangementConfig:
        for name, field in (("{position}", "location_hint"), ("{ranking}", "order_hint")):
            value = getattr(self, field)
            if name not in value:
                raise ValueError(f"{field} must contain '{name}', got {value!r}")
            if any(char in value for char in _RESERVED_PROMPT_CHARACTERS):
                raise ValueError(
                    f"{field} must not contain the characters \\x00 to \\x02 (reserved for "
                    "the prompt layout); remove them"
                )
        return self


class ExperimentalConfig(_Frozen):
    """Research levers, off or fixed by default; the policies and benchmarks set them."""

    recompute: RecomputeLevers = Field(default_factory=RecomputeLevers)
    augment: AugmentLevers = Field(default_factory=AugmentLevers)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    variants: VariantConfig = Field(default_factory=VariantConfig)
    alternative_path: TierConfig = Field(
        default_factory=lambda: TierConfig(enabled=False, recompute_ratio=0.15),
        description="FusionRAG's alternative path: a chunk is also found under any shorter run "
        "of the chunks just before it (the longest first), as stored by an earlier prompt.",
    )
    arrangement: ArrangementConfig = Field(default_factory=ArrangementConfig)


def _moved() -> dict[tuple[str, ...], tuple[str, ...]]:
    moved: dict[tuple[str, ...], tuple[str, ...]] = {}
    for name in RecomputeLevers.model_fields:
        moved[("cache", "recompute", name)] = ("experimental", "recompute", name)
    for name in AugmentLevers.model_fields:
        moved[("augment", name)] = ("experimental", "augment", name)
    for name in ("fusion", "variants", "alternative_path"):
        moved[("cache", name)] = ("experimental", name)
    moved[("cache", "reorder")] = ("experimental", "arrangement", "reorder")
    moved[("prompt", "order_hint")] = ("experimental", "arrangement", "order_hint")
    for name in ("deduplicate", "location_hint"):
        moved[("chat", name)] = ("experimental", "arrangement", name)
    return moved


MOVED = _moved()
"""Old key -> its key in ``experimental``, for configurations written before the section."""


def move_to_experimental(data: dict[str, Any]) -> None:
    """Move every old key of ``data`` (a configuration's fields) to its ``experimental`` key.

    A value under the old key replaces the one under the new key; each move is logged.
    """
    for old, new in MOVED.items():
        parent = _section(data, old[:-1])
        if parent is None or old[-1] not in parent:
            continue
        value = parent.pop(old[-1])
        target = data
        for part in new[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                return  # a malformed section: validation names it
        if isinstance(value, dict) and isinstance(target.get(new[-1]), dict):
            _deep_update(target[new[-1]], value)
        else:
            target[new[-1]] = value
        logger.warning(
            "configuration: %s moved to %s; write it there (it was read from its old place)",
            ".".join(old),
            ".".join(new),
        )


def _section(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    for part in path:
        value = data.get(part)
        if not isinstance(value, dict):
            return None
        data = value
    return data
