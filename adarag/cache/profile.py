"""A model's attention-sink profile (AdaCache section 3.1, Figure 4) and its analysis.

The profiler runs prompts ``[system, c_1..c_k, query]`` with full attention and averages each
layer's attention to chunk granularity. For every chunk ``c_i`` with earlier chunks, its
cross-chunk attention is split into the share on its predecessor ``c_{i-1}`` and on each earlier
chunk. A layer is *sink-dominated* when one earlier chunk (the sink) draws a larger share than the
predecessor, else *predecessor-local*. Runs of layers with one pattern form bands; the first band
boundary is the transition layer. The sink chunk (a position, e.g. the first chunk) joins the
predecessor in later chunks' effective prefix, which the soft tier's key uses.

The same JSON file carries the model's calibration for adaptive context augmentation.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch

from adarag.errors import ConfigError

FORMAT = "adarag-profile-1"
Pattern = Literal["predecessor", "sink"]


@dataclass(frozen=True)
class LayerBand:
    """Consecutive layers ``[start, end)`` with one attention pattern."""

    start: int
    end: int
    pattern: Pattern


@dataclass(frozen=True)
class Calibration:
    """Constants of the augmentation confidence (fitted by ``adarag calibrate``)."""

    threshold: float = 0.5
    kl_weight: float = 0.5
    kl_scale: float = 1.0
    entropy_scale: float = 1.0


@dataclass(frozen=True)
class ModelProfile:
    """Attention-sink profile and calibration of one model."""

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

    def to_json(self) -> str:
        """The profile as JSON."""
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1)

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
            data["calibration"] = Calibration(**data.get("calibration") or {})
            for name in ("predecessor_share", "sink_share"):
                data[name] = tuple(data.get(name, ()))
            data["chunk_attention"] = tuple(
                tuple(tuple(row) for row in layer) for layer in data.get("chunk_attention", ())
            )
            return cls(**data)
        except (ValueError, TypeError, KeyError) as err:
            raise ConfigError(f"{source} is not a valid adarag model profile: {err}") from err

    def with_calibration(self, calibration: Calibration) -> ModelProfile:
        """The same profile with new calibration constants."""
        return ModelProfile(**{**self.__dict__, "calibration": calibration})


def generic_profile(model: str, fingerprint: str, num_layers: int) -> ModelProfile:
    """The fallback for a model never profiled: predecessor-only soft keys, default calibration."""
    return ModelProfile(
        model, fingerprint, num_layers, None, None, (LayerBand(0, num_layers, "predecessor"),)
    )


def find_profile(
    model: str, fingerprint: str, num_layers: int, search_dirs: list[Path]
) -> ModelProfile | None:
    """The profile for a model: by fingerprint in ``search_dirs``, else a packaged one by name.

    Packaged profiles (``adarag/profiles/<model>.json``) match on the checkpoint's directory name
    and layer count, since converting the same GGUF with another transformers version changes
    the fingerprint but not the weights.
    """
    for directory in search_dirs:
        path = directory / f"{fingerprint}.json"
        if path.is_file():
            return ModelProfile.from_json(path.read_text(), str(path))
    packaged = resources.files("adarag.profiles").joinpath(f"{model}.json")
    if packaged.is_file():
        profile = ModelProfile.from_json(packaged.read_text(), f"packaged profile {model}")
        if profile.num_layers == num_layers:
            return profile
    return None


def analyse_chunk_attention(
    chunk_attention: torch.Tensor,
    min_band_layers: int = 2,
    min_share_of_predecessor: float = 0.75,
    min_concentration: float = 1.25,
) -> tuple[list[Pattern], list[float], list[float], int | None]:
    """Per-layer pattern, predecessor share and sink share, and the sink chunk.

    Only chunks with at least three earlier chunks are read, so that a candidate sink competes
    with other non-predecessor chunks (earlier rows would favour the first chunk by default).
    Shares are of a chunk's cross-chunk attention (to earlier chunks). The candidate sink of a
    layer is the earlier non-predecessor chunk with the largest mean share; the layer is
    sink-dominated when that share is at least ``min_share_of_predecessor`` times the
    predecessor's and ``min_concentration`` times the mean of the other non-predecessor chunks.

    Args:
        chunk_attention: [num_layers, num_segments, num_segments] mean attention mass from query
            segment to key segment, segments ``[system, c_1..c_k, query]`` with k >= 4.
        min_band_layers: Runs shorter than this are merged into their neighbours.
        min_share_of_predecessor: Sink rule, see above.
        min_concentration: Sink rule, see above.

    Returns:
        ``(patterns, predecessor_share, sink_share, sink_chunk_idx)``; the index is 0-based, None
        when no layer is sink-dominated.
    """
    num_layers, num_segments, _ = chunk_attention.shape
    num_chunks = num_segments - 2
    if num_chunks < 4:
        raise ConfigError(f"profiling needs at least 4 chunks per prompt, got {num_chunks}")
    patterns: list[Pattern] = []
    predecessor_share, sink_share, sink_votes = [], [], Counter[int]()
    for layer in range(num_layers):
        received = torch.zeros(num_chunks - 2)  # share of each non-predecessor candidate
        counts = torch.zeros(num_chunks - 2)
        predecessor, others = [], []
        for row in range(4, num_chunks + 1):  # segment index of c_row, >= 3 earlier chunks
            cross = chunk_attention[layer, row, 1:row]
            total = float(cross.sum())
            if total <= 0.0:
                continue
            shares = cross / total
            predecessor.append(float(shares[-1]))
            received[: row - 2] += shares[:-1]
            counts[: row - 2] += 1
            others.append(shares[:-1])
        mean_received = received / counts.clamp(min=1)
        sink_idx = int(mean_received.argmax())
        candidate = float(mean_received[sink_idx])
        rest = [float(torch.cat((o[:sink_idx], o[sink_idx + 1 :])).mean()) for o in others]
        pred = sum(predecessor) / max(len(predecessor), 1)
        rest_mean = sum(rest) / max(len(rest), 1)
        predecessor_share.append(pred)
        sink_share.append(candidate)
        is_sink = (
            candidate >= min_share_of_predecessor * pred
            and candidate >= min_concentration * rest_mean
        )
        patterns.append("sink" if is_sink else "predecessor")
        if is_sink:
            sink_votes[sink_idx] += 1
    patterns = _smooth(patterns, min_band_layers)
    has_sink = "sink" in patterns and bool(sink_votes)
    sink_chunk = sink_votes.most_common(1)[0][0] if has_sink else None
    return patterns, predecessor_share, sink_share, sink_chunk


def bands_of(patterns: list[Pattern]) -> tuple[LayerBand, ...]:
    """Maximal runs of equal patterns."""
    bands: list[LayerBand] = []
    for layer, pattern in enumerate(patterns):
        if bands and bands[-1].pattern == pattern:
            bands[-1] = LayerBand(bands[-1].start, layer + 1, pattern)
        else:
            bands.append(LayerBand(layer, layer + 1, pattern))
    return tuple(bands)


def _smooth(patterns: list[Pattern], min_run: int) -> list[Pattern]:
    """Flip runs shorter than ``min_run`` (not at the ends) to the surrounding pattern."""
    smoothed = list(patterns)
    for band in bands_of(patterns):
        is_inner = band.start > 0 and band.end < len(patterns)
        if is_inner and band.end - band.start < min_run:
            other: Pattern = "predecessor" if band.pattern == "sink" else "sink"
            smoothed[band.start : band.end] = [other] * (band.end - band.start)
    return smoothed
