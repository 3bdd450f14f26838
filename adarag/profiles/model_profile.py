"""A model's profile: its attention sinks (AdaCache section 3.1), calibration, learned controllers.

``adarag profile`` measures the sinks (:mod:`adarag.evaluation.profiling.sinks`), ``adarag
calibrate`` fits the calibration (:mod:`adarag.evaluation.profiling.calibration`); both are saved
in one JSON file per model.
The pipeline reads them from here: the sink chunk joins the predecessor in later chunks'
effective prefix (the soft tier's key), the calibration sets the stop rule, and the learned
controllers (:mod:`adarag.profiles.learned`) score the tokens to recompute, route requests up the
ladder and stop adaptive augmentation, and the gain calibration (:mod:`adarag.profiles.gain`)
sets the τ of the ``gain`` stop rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from adarag.errors import ConfigError
from adarag.fitted import FittedModel
from adarag.profiles.gain import GainCalibration
from adarag.profiles.learned import DepthProbe, LadderCalibration
from adarag.profiles.packet import PacketRecord, read_packet

logger = logging.getLogger(__name__)

FORMAT = "adarag-profile-1"
Pattern = Literal["predecessor", "sink"]


@dataclass(frozen=True)
class LayerBand:
    """Consecutive layers ``[start, end)`` with one attention pattern."""

    start: int
    end: int
    pattern: Pattern


@dataclass(frozen=True)
class AgreementCalibration:
    """The agreement stop rule's constants (fitted by ``adarag calibrate``).

    Attributes:
        feature: The step score the map reads ("confidence", "margin" or "mean").
        knots: Ascending scores of the isotonic map.
        probabilities: P(the step's answer equals the static top-k answer) at the knots.
        threshold: τ for ``risk``; None when no τ was safe enough (augmentation stays static).
        risk: ε, the tolerated share of early stops that change the static top-k answer.
        min_steps: The floor on chunks before a stop.
        held_out_risk: The share measured on the held-out half of the calibration questions.
        cost_share: Predicted time of the held-out half's steps at τ, as a share of static
            top-k's prefill time (a τ is kept only when this is small enough).
    """

    feature: str
    knots: tuple[float, ...]
    probabilities: tuple[float, ...]
    threshold: float | None
    risk: float
    min_steps: int
    held_out_risk: float | None = None
    cost_share: float | None = None


@dataclass(frozen=True)
class Calibration:
    """Constants of the augmentation confidence (fitted by ``adarag calibrate``)."""

    threshold: float = 0.5
    kl_weight: float = 0.5
    kl_scale: float = 1.0
    entropy_scale: float = 1.0
    agreement: AgreementCalibration | None = None


@dataclass(frozen=True)
class ModelProfile:
    """Attention-sink profile and calibration of one model.

    ``fingerprint`` is the profiled checkpoint's (its config and weights files, as the KV cache
    keys use it); ``weights_fingerprint`` digests its tensors alone, so that a copy of the same
    weights under another name, or saved by another transformers version, finds the profile.
    """

    model: str
    fingerprint: str
    num_layers: int
    transition_layer: int | None
    sink_chunk_idx: int | None
    bands: tuple[LayerBand, ...]
    predecessor_share: tuple[float, ...] = ()
    sink_share: tuple[float, ...] = ()
    num_prompts: int = 0
    num_chunks: int = 0
    chunk_attention: tuple[tuple[tuple[float, ...], ...], ...] = ()
    calibration: Calibration = field(default_factory=Calibration)
    weights_fingerprint: str | None = None
    selector: FittedModel | None = None
    ladder: LadderCalibration | None = None
    depth_probe: DepthProbe | None = None
    gain: GainCalibration | None = None
    packet: PacketRecord | None = None
    packet_bytes: bytes | None = field(default=None, repr=False, compare=False)
    """The packet file's bytes (checked against ``packet.digest``), when the profile was read
    from a folder holding it; never written into the JSON."""

    def to_json(self) -> str:
        """The profile as JSON (the packet's bytes go in their own file)."""
        data = asdict(self)
        data.pop("packet_bytes")
        data["ladder"] = None if self.ladder is None else self.ladder.to_dict()
        data["depth_probe"] = None if self.depth_probe is None else self.depth_probe.to_dict()
        data["gain"] = None if self.gain is None else self.gain.to_dict()
        data["packet"] = None if self.packet is None else self.packet.to_dict()
        return json.dumps({"format": FORMAT, **data}, indent=1)

    @classmethod
    def read(cls, folder: Traversable, name: str, source: str | None = None) -> ModelProfile:
        """The profile file ``name`` in ``folder``, with its packet's bytes when it names one.

        Raises:
            ConfigError: The file is not a profile, or its packet file is missing or altered.
        """
        source = source or str(folder.joinpath(name))
        profile = cls.from_json(folder.joinpath(name).read_text(), source)
        if profile.packet is None:
            return profile
        return replace(profile, packet_bytes=read_packet(profile.packet, folder, source))

    @classmethod
    def from_json(cls, text: str, source: str) -> ModelProfile:
        """Parse a profile file.

        Raises:
            ConfigError: The text is not an adarag profile.
        """
        try:
            data: dict[str, Any] = json.loads(text)
            if data.pop("format", None) != FORMAT:
                raise ValueError(f"format is not {FORMAT}")
            data["bands"] = tuple(LayerBand(**band) for band in data["bands"])
            calibration = dict(data.get("calibration") or {})
            if calibration.get("agreement") is not None:
                agreement = dict(calibration["agreement"])
                agreement["knots"] = tuple(agreement["knots"])
                agreement["probabilities"] = tuple(agreement["probabilities"])
                calibration["agreement"] = AgreementCalibration(**agreement)
            data["calibration"] = Calibration(**calibration)
            for name in ("predecessor_share", "sink_share"):
                data[name] = tuple(data.get(name, ()))
            data["chunk_attention"] = tuple(
                tuple(tuple(row) for row in layer) for layer in data.get("chunk_attention", ())
            )
            for name, kind in (
                ("selector", FittedModel),
                ("ladder", LadderCalibration),
                ("depth_probe", DepthProbe),
                ("gain", GainCalibration),
                ("packet", PacketRecord),
            ):
                found = data.get(name)
                data[name] = None if found is None else kind.from_dict(found)
            return cls(**data)
        except (ValueError, TypeError, KeyError, AssertionError) as err:
            raise ConfigError(f"{source} is not a valid adarag model profile: {err}") from err

    def with_calibration(self, calibration: Calibration) -> ModelProfile:
        """The same profile with new calibration constants."""
        return replace(self, calibration=calibration)

    def with_learned(self, **learned: Any) -> ModelProfile:
        """The same profile with new ``selector``, ``ladder``, ``depth_probe``, ``gain``, packet."""
        return replace(self, **learned)


def generic_profile(model: str, fingerprint: str, num_layers: int) -> ModelProfile:
    """The fallback for a model never profiled: predecessor-only soft keys, default calibration."""
    return ModelProfile(
        model, fingerprint, num_layers, None, None, (LayerBand(0, num_layers, "predecessor"),)
    )


def find_profile(
    model: str,
    fingerprint: str,
    num_layers: int,
    search_dirs: list[Path],
    weights_fingerprint: Callable[[], str] | None = None,
    packaged: Traversable | None = None,
) -> ModelProfile | None:
    """The profile for a model: by fingerprint in ``search_dirs``, else a packaged one.

    A packaged profile (``adarag/profiles/<model>.json``) matches on the checkpoint's name and
    layer count, since converting the same GGUF with another transformers version changes the
    fingerprint but not the weights; failing that, on the weights' fingerprint and layer count,
    so a renamed copy of a packaged model keeps its profile.

    Args:
        model: The checkpoint's name.
        fingerprint: The checkpoint's fingerprint.
        num_layers: Its layer count.
        search_dirs: Folders of profiles named ``<fingerprint>.json`` (made by ``adarag
            profile`` and ``adarag calibrate``).
        weights_fingerprint: Computes the weights' fingerprint; called only when a packaged
            profile of the same layer count could match it. None skips that match.
        packaged: The folder of packaged profiles; None: the one shipped, ``adarag.profiles``.

    Raises:
        ConfigError: A profile file that matches is not a valid profile.
    """
    for directory in search_dirs:
        path = directory / f"{fingerprint}.json"
        if path.is_file():
            return ModelProfile.read(directory, path.name)
    folder = packaged if packaged is not None else resources.files("adarag.profiles")
    files = [file for file in folder.iterdir() if file.name.endswith(".json")]
    by_name = next((file for file in files if file.name == f"{model}.json"), None)
    if by_name is not None:
        profile = ModelProfile.read(folder, by_name.name, f"packaged profile {by_name.name}")
        if profile.num_layers == num_layers:
            return profile
    if weights_fingerprint is None:
        return None
    return _by_weights(model, num_layers, folder, files, weights_fingerprint)


def _by_weights(
    model: str,
    num_layers: int,
    folder: Traversable,
    files: Sequence[Traversable],
    weights_fingerprint: Callable[[], str],
) -> ModelProfile | None:
    """The packaged profile whose weights' fingerprint and layer count are the model's."""
    candidates = [
        profile
        for profile in (
            ModelProfile.read(folder, file.name, f"packaged profile {file.name}") for file in files
        )
        if profile.num_layers == num_layers and profile.weights_fingerprint is not None
    ]
    if not candidates:
        return None
    try:
        digest = weights_fingerprint()
    except (OSError, ValueError) as err:
        logger.warning("cannot digest the weights of %s to find its profile: %s", model, err)
        return None
    found = next((p for p in candidates if p.weights_fingerprint == digest), None)
    if found is not None:
        logger.info("%s has the weights of %s: using its packaged profile", model, found.model)
    return found
