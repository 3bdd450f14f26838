"""The learned controllers a model's profile carries, as ``adarag calibrate`` fitted them.

- ``selector``: the ``learned`` selection rule's scorer (a :class:`~adarag.fitted.FittedModel`
  over token features), fitted with ``adarag calibrate --selector``.
- ``ladder`` (:class:`LadderCalibration`): the routing ladder's rungs, one agreement model per
  decision, and the thresholds that meet each target agreement on the calibration questions
  (``cache.recompute.target_agreement`` picks one).
- ``depth_probe`` (:class:`DepthProbe`): the ``probe`` stop rule's sufficiency model and its
  threshold, fitted with ``adarag calibrate --depth``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adarag.fitted import FittedModel


@dataclass(frozen=True)
class LadderCalibration:
    """A fitted routing ladder.

    Attributes:
        base_ratio: The ratio of the first rung (the reused chunks' own).
        rungs: The ratios climbed to, ascending.
        models: Per decision (at the base rung and each rung but the last), P(the answer at
            that rung equals full recomputation's).
        targets: Ascending target agreements the thresholds were fitted for.
        thresholds: Per target, one threshold per decision (climb below it).
        held_out: Per target, [exact agreement, mean cost as a share of full recomputation's
            tokens] of the ladder on the calibration questions held out when fitting (cross-fit).
    """

    base_ratio: float
    rungs: tuple[float, ...]
    models: tuple[FittedModel, ...]
    targets: tuple[float, ...]
    thresholds: tuple[tuple[float, ...], ...]
    held_out: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        assert len(self.models) == len(self.rungs), "one model per decision"
        assert len(self.thresholds) == len(self.targets), "one threshold row per target"
        assert all(len(row) == len(self.rungs) for row in self.thresholds), "per decision"

    def thresholds_for(self, target: float) -> tuple[float, ...] | None:
        """The thresholds of the smallest fitted target at least ``target`` (None: none is)."""
        for fitted, row in zip(self.targets, self.thresholds, strict=True):
            if fitted >= target - 1e-9:
                return row
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "base_ratio": self.base_ratio,
            "rungs": list(self.rungs),
            "models": [model.to_dict() for model in self.models],
            "targets": list(self.targets),
            "thresholds": [list(row) for row in self.thresholds],
            "held_out": [list(row) for row in self.held_out],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LadderCalibration:
        """Read :meth:`to_dict`'s output."""
        return cls(
            base_ratio=float(data["base_ratio"]),
            rungs=tuple(float(r) for r in data["rungs"]),
            models=tuple(FittedModel.from_dict(model) for model in data["models"]),
            targets=tuple(float(t) for t in data["targets"]),
            thresholds=tuple(tuple(float(t) for t in row) for row in data["thresholds"]),
            held_out=tuple((float(row[0]), float(row[1])) for row in data.get("held_out", ())),
        )


@dataclass(frozen=True)
class DepthProbe:
    """The ``probe`` stop rule's model: P(no later depth answers better) at a step.

    Attributes:
        model: Over the step's features (:mod:`adarag.augment.probe`).
        threshold: Stop at the first step whose probability reaches it.
        min_steps: Never stop before this many chunks.
        layers: The layers whose residual stream (last prompt token, after the layer) the
            model reads, concatenated in this order as ``hidden_<i>``.
    """

    model: FittedModel
    threshold: float
    min_steps: int = 1
    layers: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "model": self.model.to_dict(),
            "threshold": self.threshold,
            "min_steps": self.min_steps,
            "layers": list(self.layers),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DepthProbe:
        """Read :meth:`to_dict`'s output."""
        return cls(
            FittedModel.from_dict(data["model"]),
            float(data["threshold"]),
            int(data.get("min_steps", 1)),
            tuple(int(layer) for layer in data.get("layers", ())),
        )
