"""The augmentation loop one request runs, built from a pipeline's resources and config.

A stop rule the model's profile has no fit for (an agreement rule without a calibrated τ, a
probe never fitted) cannot adapt the depth: the request then answers from the static top-k in
one step (:func:`is_static_fallback`).
"""

from __future__ import annotations

from collections.abc import Sequence

from adarag.augment import STOP_RULES
from adarag.config import AugmentConfig
from adarag.pipeline.controller import build_controller, fitted_stops
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.profiles.model_profile import ModelProfile


def is_static_fallback(augment: AugmentConfig, profile: ModelProfile) -> bool:
    """Whether augmentation is on with a stop rule the model's profile has no fit for."""
    if not augment.enabled:
        return False
    fitted = fitted_stops(augment, profile)
    return STOP_RULES[augment.stop_rule](augment.min_chunks, fitted) is None


def augmented_prefill(
    resources: Resources, augment: AugmentConfig, layers: Sequence[int] | None = None
) -> AugmentedPrefill:
    """The augmentation loop over the pipeline's generator and cache, augmenting per ``augment``.

    The controller comes from the pipeline's own ``config.augment`` and the model's calibration;
    ``augment`` may differ from it only in being switched off (the static fallback). ``layers``
    overrides the residual-stream layers each step reports (calibrating the depth probe).
    """
    config, generator = resources.config, resources.generator
    controller = build_controller(config.augment, generator.spec.num_layers, resources.profile)
    return AugmentedPrefill(
        generator,
        resources.cache,
        config.cache,
        augment,
        controller,
        resources.engine_lock,
        resources.system_kv,
        resources.learned,
        probe_layers(augment, resources.profile) if layers is None else tuple(layers),
    )


def probe_layers(augment: AugmentConfig, profile: ModelProfile) -> tuple[int, ...]:
    """The layers whose residual stream the stop rule reads (the probe's; none otherwise)."""
    if augment.stop_rule != "probe" or profile.depth_probe is None:
        return ()
    return profile.depth_probe.layers
