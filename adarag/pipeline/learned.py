"""The learned controls a request's fused prefills carry, read from the model's profile.

``selection_policy="learned"`` scores tokens with the profile's fitted selector and
``cache.recompute.target_agreement`` climbs the profile's routing ladder. A model whose profile
lacks one falls back (``query_deviation``'s scores; no routing) and the pipeline says so once
in the log. ``cache.recompute.packet`` brings the profile's packet table: the bridge a prompt
reusing chunk KV carries, and the trailer every chunk ends with.
"""

from __future__ import annotations

import logging

import torch
from safetensors.torch import load

from adarag.config import RecomputeSettings
from adarag.engine.prefill_request import LearnedControls
from adarag.engine.routing import RoutingLadder
from adarag.errors import ConfigError
from adarag.profiles import ModelProfile
from adarag.profiles.packet import BRIDGE, TRAILER, PacketRecord

logger = logging.getLogger(__name__)


def learned_controls(
    recompute: RecomputeSettings, profile: ModelProfile, backend: str = "torch"
) -> LearnedControls:
    """The controls ``recompute`` asks for, as far as ``profile`` has them (logs what it lacks).

    Raises:
        ConfigError: ``packet="on"`` but the profile has no packet, or the engine is not the
            torch engine (vLLM takes token ids, which packet tokens are not).
    """
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
    packet = _packet(recompute, profile, backend)
    if packet is None:
        return LearnedControls(scorer, ladder)
    table, record = packet
    return LearnedControls(
        scorer,
        ladder,
        table,
        record.bridge_tokens,
        record.trailer_tokens,
        record.digest,
        record.bridge_replaces,
    )


def _packet(
    recompute: RecomputeSettings, profile: ModelProfile, backend: str
) -> tuple[torch.Tensor, PacketRecord] | None:
    """The profile's packet table, if ``recompute.packet`` asks for it and the engine takes it."""
    if recompute.packet == "off":
        return None
    wanted = recompute.packet == "on"
    if profile.packet is None or profile.packet_bytes is None:
        if wanted:
            raise ConfigError(
                f"cache.recompute.packet='on' but the profile of {profile.model} has no packet; "
                "fit one with `adarag calibrate --packet`, or set packet to 'auto' or 'off'"
            )
        return None
    if backend != "torch":
        if wanted:
            raise ConfigError(
                f"packet tokens need adarag's torch engine, not engine.backend={backend!r} "
                "(vLLM reads token ids, and a packet token has none); set "
                "cache.recompute.packet='off' or 'auto'"
            )
        logger.info(
            "engine.backend=%s cannot carry packet tokens: %s answers without its packet",
            backend,
            profile.model,
        )
        return None
    tensors = load(profile.packet_bytes)
    parts = [tensors[name].float() for name in (BRIDGE, TRAILER) if name in tensors]
    return torch.cat(parts), profile.packet
