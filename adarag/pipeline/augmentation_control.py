"""The augmentation loop a pipeline's requests run, and its controller, built once per pipeline.

The controller comes from the config and the model's calibration. A stop rule the model's profile
has no fit for (an agreement rule without a calibrated τ, a probe never fitted) cannot adapt the
depth: the request then answers from the static top-k in one step (:func:`is_static_fallback`),
and the loop says so once, when it is built. The ``gain`` rule chooses the chunks before the
loop (:mod:`adarag.pipeline.gain_selection`); the loop then prefills them in one step, or adds
them one at a time under the lens confidence with ``experimental.augment.gain_confidence``.
"""

from __future__ import annotations

import logging

from adarag.augment import (
    AgreementModel,
    AugmentationController,
    ConfidenceParams,
    FittedStops,
    LensConfidence,
    ThresholdStop,
    stop_rules,
)
from adarag.config import AdaRagConfig, AugmentConfig, AugmentLevers
from adarag.errors import ConfigError
from adarag.pipeline.gain_selection import gain_notes
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.profiles.model_profile import AgreementCalibration, ModelProfile

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")


def fitted_stops(
    augment: AugmentConfig, profile: ModelProfile, levers: AugmentLevers
) -> FittedStops:
    """What the profile's calibration fitted for the stop rules (the config's τ first)."""
    calibration = profile.calibration
    threshold = calibration.threshold if augment.threshold is None else augment.threshold
    agreement = None
    fitted = calibration.agreement
    if fitted is not None and fitted.threshold is not None:
        model = AgreementModel.from_knots(fitted.feature, fitted.knots, fitted.probabilities)
        agreement = (model, fitted.threshold, fitted.min_steps)
    depth = profile.depth_probe
    probe = None if depth is None else (depth.model, depth.threshold, depth.min_steps)
    return FittedStops(threshold, agreement, probe, levers.gain_confidence)


def build_controller(
    augment: AugmentConfig, levers: AugmentLevers, num_layers: int, profile: ModelProfile
) -> AugmentationController:
    """The controller of ``augment.stop_rule`` (static top-k when the model lacks its fit)."""
    if levers.num_lens_layers > num_layers:
        raise ConfigError(
            f"experimental.augment.num_lens_layers is {levers.num_lens_layers} but the model has "
            "only "
            f"{num_layers} layers; set it between 2 and {num_layers}"
        )
    calibration = profile.calibration
    fitted = fitted_stops(augment, profile, levers)
    kl_weight = calibration.kl_weight if levers.kl_weight is None else levers.kl_weight
    params = ConfidenceParams(kl_weight, calibration.kl_scale, calibration.entropy_scale)
    estimator = LensConfidence(params, levers.estimator)
    rule = stop_rules.build_stop_rule(augment.stop_rule, levers.min_chunks, fitted)
    if rule is None:  # static top-k (see is_static_fallback)
        return AugmentationController(estimator, ThresholdStop(fitted.threshold))
    agreement = (
        fitted.agreement[0] if augment.stop_rule == "agreement" and fitted.agreement else None
    )
    return AugmentationController(estimator, rule, agreement)


def static_fallback_message(stop_rule: str, profile: ModelProfile) -> str:
    """Why ``stop_rule`` answers from the static top-k for ``profile``'s model."""
    model = profile.model
    if stop_rule == "probe":
        return (
            f"no depth probe fitted for {model}; answering from the static top-k (run `adarag "
            "calibrate --depth` to fit one)"
        )
    agreement: AgreementCalibration | None = profile.calibration.agreement
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


def is_static_fallback(
    augment: AugmentConfig, levers: AugmentLevers, profile: ModelProfile
) -> bool:
    """Whether augmentation is on with a stop rule the model's profile has no fit for.

    Not the ``gain`` rule: without ``gain_confidence`` its one prefill is the rule itself.
    """
    if not augment.enabled or augment.stop_rule == "gain":
        return False
    fitted = fitted_stops(augment, profile, levers)
    return stop_rules.build_stop_rule(augment.stop_rule, levers.min_chunks, fitted) is None


def augmented_prefill(resources: Resources) -> AugmentedPrefill:
    """The augmentation loop over the pipeline's engine and cache, per its ``config.augment``.

    The controller comes from the model's calibration; a stop rule without one switches
    augmentation off (static top-k), logged here once per pipeline, as is the ``gain`` rule's
    use of the hand-made τ. The ``gain`` rule without ``gain_confidence`` runs one step.
    """
    config, engine, profile = resources.config, resources.engine, resources.profile
    augment, levers = config.augment, config.experimental.augment
    controller = build_controller(augment, levers, engine.spec.num_layers, profile)
    if is_static_fallback(augment, levers, profile):
        # the documented default of both packaged models, not a fault: info, not warning
        logger.info(static_fallback_message(augment.stop_rule, profile))
        static = augment.model_copy(update={"enabled": False})
        config = config.model_copy(update={"augment": static})
    if augment.enabled and augment.stop_rule == "gain":
        for note in gain_notes(levers, profile):
            logger.info(note)
        if levers.gain_confidence is None:  # one prefill of the kept chunks
            static = augment.model_copy(update={"enabled": False})
            config = config.model_copy(update={"augment": static})
    return AugmentedPrefill(
        engine,
        resources.cache,
        config,
        controller,
        resources.engine_lock,
        resources.system_kv() if reuses_chunk_kv(config) else None,
        resources.learned,
        probe_layers(config.augment, profile),
    )


def reuses_chunk_kv(config: AdaRagConfig) -> bool:
    """Whether any tier is on (a prefill then reuses the system prefix's exact KV)."""
    tiers, strategies = config.cache, config.experimental
    return any(
        (
            tiers.hard.enabled,
            tiers.soft.enabled,
            tiers.independent.enabled,
            strategies.alternative_path.enabled,
            strategies.variants.enabled,
            strategies.fusion.enabled,
        )
    )


def probe_layers(augment: AugmentConfig, profile: ModelProfile) -> tuple[int, ...]:
    """The layers whose residual stream the stop rule reads (the probe's; none otherwise)."""
    if augment.stop_rule != "probe" or profile.depth_probe is None:
        return ()
    return profile.depth_probe.layers
