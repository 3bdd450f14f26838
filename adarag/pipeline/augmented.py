"""The augmentation loop one request runs, built from a pipeline's resources and config.

An agreement stop rule with no calibrated threshold for the model cannot adapt the depth: the
request then answers from the static top-k in one step (:func:`is_static_fallback`).
"""

from __future__ import annotations

from adarag.config import AugmentConfig
from adarag.pipeline.controller import build_controller
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.profiles.model_profile import Calibration


def is_static_fallback(augment: AugmentConfig, calibration: Calibration) -> bool:
    """Whether augmentation is on with an agreement rule that has no calibrated threshold."""
    agreement = calibration.agreement
    uncalibrated = agreement is None or agreement.threshold is None
    return augment.enabled and augment.stop_rule == "agreement" and uncalibrated


def augmented_prefill(resources: Resources, augment: AugmentConfig) -> AugmentedPrefill:
    """The augmentation loop over the pipeline's generator and cache, augmenting per ``augment``.

    The controller comes from the pipeline's own ``config.augment`` and the model's calibration;
    ``augment`` may differ from it only in being switched off (the static fallback).
    """
    config, generator = resources.config, resources.generator
    controller = build_controller(
        config.augment, generator.spec.num_layers, resources.profile.calibration
    )
    return AugmentedPrefill(
        generator,
        resources.cache,
        config.cache,
        augment,
        controller,
        resources.engine_lock,
        resources.system_kv,
        resources.learned,
    )
