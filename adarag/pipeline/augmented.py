"""The augmentation loop a pipeline's requests run, built once from its resources and config.

A stop rule the model's profile has no fit for (an agreement rule without a calibrated τ, a
probe never fitted) cannot adapt the depth: the request then answers from the static top-k in
one step (:func:`is_static_fallback`), and the loop says so once, when it is built.
"""

from __future__ import annotations

import logging

from adarag.augment import stop_rules
from adarag.config import AugmentConfig, AugmentLevers
from adarag.pipeline.augmentation_control import (
    build_controller,
    fitted_stops,
    static_fallback_message,
)
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.profiles.model_profile import ModelProfile

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")


def is_static_fallback(
    augment: AugmentConfig, levers: AugmentLevers, profile: ModelProfile
) -> bool:
    """Whether augmentation is on with a stop rule the model's profile has no fit for."""
    if not augment.enabled:
        return False
    fitted = fitted_stops(augment, profile)
    return stop_rules.build_stop_rule(augment.stop_rule, levers.min_chunks, fitted) is None


def augmented_prefill(resources: Resources) -> AugmentedPrefill:
    """The augmentation loop over the pipeline's engine and cache, per its ``config.augment``.

    The controller comes from the model's calibration; a stop rule without one switches
    augmentation off (static top-k), logged here once per pipeline.
    """
    config, engine, profile = resources.config, resources.engine, resources.profile
    augment, levers = config.augment, config.experimental.augment
    controller = build_controller(augment, levers, engine.spec.num_layers, profile)
    if is_static_fallback(augment, levers, profile):
        # the documented default of both packaged models, not a fault: info, not warning
        logger.info(static_fallback_message(augment.stop_rule, profile))
        static = augment.model_copy(update={"enabled": False})
        config = config.model_copy(update={"augment": static})
    return AugmentedPrefill(
        engine,
        resources.cache,
        config,
        controller,
        resources.engine_lock,
        resources.system_kv,
        resources.learned,
        probe_layers(config.augment, profile),
    )


def probe_layers(augment: AugmentConfig, profile: ModelProfile) -> tuple[int, ...]:
    """The layers whose residual stream the stop rule reads (the probe's; none otherwise)."""
    if augment.stop_rule != "probe" or profile.depth_probe is None:
        return ()
    return profile.depth_probe.layers
