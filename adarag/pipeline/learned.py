"""The learned controls a request's fused prefills carry, read from the model's profile.

``selection_policy="learned"`` scores tokens with the profile's fitted selector and
``cache.recompute.target_agreement`` climbs the profile's routing ladder. A model whose profile
lacks one falls back (``query_deviation``'s scores; no routing) and the pipeline says so once
in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from adarag.config import RecomputeSettings
from adarag.engine.routing import RoutingLadder
from adarag.fitted import FittedModel
from adarag.profiles import ModelProfile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnedControls:
    """What a fused prefill reads from the profile: the token scorer and the ladder."""

    token_scorer: FittedModel | None = None
    ladder: RoutingLadder | None = None


def learned_controls(recompute: RecomputeSettings, profile: ModelProfile) -> LearnedControls:
    """The controls ``recompute`` asks for, as far as ``profile`` has them (logs what it lacks)."""
    scorer = None
    if recompute.selection_policy == "learned":
        scorer = profile.selector
        if scorer is None:
            logger.warning(
                "no fitted selector for %s: the 'learned' selection scores as query_deviation; "
                "run `adarag calibrate --selector` to fit one",
                profile.model,
            )
    ladder = None
    target = recompute.target_agreement
    if target is not None:
        fitted = profile.ladder
        thresholds = None if fitted is None else fitted.thresholds_for(target)
        if fitted is None or thresholds is None:
            logger.warning(
                "no routing ladder fitted for %s at target agreement %.2f: requests answer at "
                "their own ratio; run `adarag calibrate --selector --target-agreement %.2f`",
                profile.model,
                target,
                target,
            )
        else:
            ladder = RoutingLadder(fitted.rungs, fitted.models, thresholds)
    return LearnedControls(scorer, ladder)
