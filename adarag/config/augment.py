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
    stop_rule: Literal["confidence", "agreement", "probe", "gain"] = Field(
        default="agreement",
        description="'agreement' (the default): stop when the calibrated probability of the "
        "static top-k answer reaches the profile's τ at two consecutive steps whose first answer "
        "tokens are equal (static top-k without a calibrated τ); 'confidence': stop when the "
        "lens confidence alone reaches τ; 'probe': stop when the depth probe fitted by `adarag "
        "calibrate --depth` (the last prompt token's residual stream, the lens signals and the "
        "retrieval scores) gives a probability at least its τ that no later depth answers "
        "better (static top-k for a model without a fitted probe); 'gain': each retrieved "
        "chunk's information gain is scored from its cached KV in one batched pass over the "
        "question's tokens, the chunks under τ (the profile's, fitted by `adarag calibrate "
        "--depth --gain-records`, else 0.05) are dropped and the rest answer in one prefill "
        "(see experimental.augment.gain_*).",
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
    gain_order: Literal["gain", "retrieval"] = Field(
        default="gain",
        description="stop_rule='gain': list the kept chunks best gain first ('gain') or in the "
        "retriever's order ('retrieval').",
    )
    gain_top_k: int = Field(
        default=20,
        ge=2,
        description="stop_rule='gain': tokens of the next-token distribution whose normalised "
        "entropy the gain compares (its top-K).",
    )
    gain_threshold: float | None = Field(
        default=None,
        ge=-1.0,
        le=1.0,
        description="stop_rule='gain': τ, the gain a chunk must reach to be kept; None: the "
        "profile's fitted τ, else IGP's 0.05.",
    )
    gain_confidence: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="stop_rule='gain': add the kept chunks one at a time and stop when the lens "
        "confidence reaches this τ (the 'confidence' rule over them); None: one prefill of the "
        "kept chunks.",
    )
