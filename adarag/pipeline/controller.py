"""The augmentation controller a pipeline runs, from its config and the model's calibration."""

from __future__ import annotations

from adarag.augment import (
    AgreementModel,
    AgreementStop,
    AugmentationController,
    ConfidenceParams,
    LensConfidence,
    ThresholdStop,
)
from adarag.config import AugmentConfig
from adarag.errors import ConfigError
from adarag.profiles.model_profile import AgreementCalibration, Calibration


def build_controller(
    augment: AugmentConfig, num_layers: int, calibration: Calibration
) -> AugmentationController:
    """The controller from the config, falling back to the profile's calibration."""
    if augment.num_lens_layers > num_layers:
        raise ConfigError(
            f"augment.num_lens_layers is {augment.num_lens_layers} but the model has only "
            f"{num_layers} layers; set it between 2 and {num_layers}"
        )
    threshold = calibration.threshold if augment.threshold is None else augment.threshold
    kl_weight = calibration.kl_weight if augment.kl_weight is None else augment.kl_weight
    params = ConfidenceParams(kl_weight, calibration.kl_scale, calibration.entropy_scale)
    estimator = LensConfidence(params, augment.estimator)
    if augment.stop_rule == "confidence":
        return AugmentationController(estimator, ThresholdStop(threshold, augment.min_chunks or 1))
    fitted = calibration.agreement
    if fitted is None or fitted.threshold is None:  # static top-k (see AdaRAG._augmented)
        return AugmentationController(estimator, ThresholdStop(threshold))
    agreement = AgreementModel.from_knots(fitted.feature, fitted.knots, fitted.probabilities)
    rule = AgreementStop(fitted.threshold, augment.min_chunks or fitted.min_steps)
    return AugmentationController(estimator, rule, agreement)


def static_fallback_message(model: str, agreement: AgreementCalibration | None) -> str:
    """Why the agreement stop rule answers from the static top-k for ``model``."""
    if agreement is None:
        return (
            f"the agreement stop rule has no calibrated threshold for {model}; answering from the "
            "static top-k (run `adarag calibrate` to adapt the depth)"
        )
    if agreement.cost_share is not None:
        return (
            f"the agreement stop rule has no calibrated threshold for {model}: at the τ safe for "
            f"ε={agreement.risk} its calibration questions' steps would take "
            f"{agreement.cost_share:.0%} of the static top-k's prefill time, too little saved to "
            "pay for the steps; answering from the static top-k"
        )
    return (
        f"the agreement stop rule has no calibrated threshold for {model}: its calibration found "
        f"no τ whose early stops kept the static top-k answer within ε={agreement.risk}; "
        "answering from the static top-k (a larger --risk may find one)"
    )
