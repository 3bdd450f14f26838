"""Adaptive context augmentation: what a user sets (``augment``) and its levers (experimental)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from adarag.config.base import _Frozen


class AugmentConfig(_Frozen):
    """Adaptive context augmentation (AdaCache section 3.2)."""

    enabled: bool = Field(default=True, description="Add chunks one at a time; else static top-k.")
    threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Confidence τ that stops; None: model profile."
    )
    stop_rule: Literal["confidence", "agreement", "probe"] = Field(
        default="agreement",
        description="'agreement' (the default): stop when the calibrated probability of the "
        "static top-k answer reaches the profile's τ at two consecutive steps whose first answer "
        "tokens are equal (static top-k without a calibrated τ); 'confidence': stop when the "
        "lens confidence alone reaches τ; 'probe': stop when the depth probe fitted by `adarag "
        "calibrate --depth` (the last prompt token's residual stream, the lens signals and the "
        "retrieval scores) gives a probability at least its τ that no later depth answers "
        "better (static top-k for a model without a fitted probe).",
    )


class AugmentLevers(_Frozen):
    """The stop rules' inner settings, for research (``experimental.augment``)."""

    kl_weight: float | None = Field(
        default=None, ge=0.0, le=1.0, description="λ weighting KL against entropy; None: profile."
    )
    num_lens_layers: int = Field(
        default=4, ge=2, description="Last l layers read by the logit lens (l - 1 KL terms)."
    )
    estimator: Literal["combined", "entropy", "kl"] = Field(
        default="combined", description="Uncertainty estimator."
    )
    stability_tokens: int = Field(
        default=4, ge=1, le=64, description="Answer tokens compared by the agreement rule."
    )
    min_chunks: int | None = Field(
        default=None, ge=1, description="Floor on chunks before a stop; None: the profile's."
    )
    reuse_step_kv: bool = Field(
        default=True,
        description="Each augmentation step prefills into the previous step's KV cache, whose "
        "system prefix and hard-tier chunks are already in place (sized for the whole prompt at "
        "the first step); False: a new cache per step, every cached chunk loaded again.",
    )
    score_gap: float | None = Field(
        default=None,
        gt=0.0,
        description="Never add chunks past the first drop of at least this much between "
        "consecutive retrieval scores (Adaptive-k); None: off.",
    )
