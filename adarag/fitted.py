"""A small fitted model: standardised features, an optional hidden layer, one logit.

The learned controllers (the recomputation selector, the routing ladder's agreement model and
the depth probe) are fitted by ``adarag calibrate`` on calibration questions
(:mod:`adarag.evaluation.profiling.fitting`) and stored in the model's profile as a
:class:`FittedModel`. Each reads its own named features; the model only maps a row of them to a
logit, and a probability through an optional isotonic map (else the logistic function).

It is plain numpy, so that every layer can evaluate it: the engine on a candidate matrix, the
augmentation controller on one step's row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FittedModel:
    """``logit(x) = w · h(x) + b`` over standardised features ``z = (x - mean) / scale``.

    ``h`` is the identity (a linear model) or one hidden layer ``relu(W_h z + b_h)``.

    Attributes:
        features: The names of the input columns, in order.
        mean: Per feature, subtracted before scaling.
        scale: Per feature, divided by (never zero).
        weights: Output weights, one per feature (linear) or per hidden unit.
        bias: Output bias.
        hidden_weights: [hidden][features]; empty for a linear model.
        hidden_bias: [hidden]; empty for a linear model.
        calibration_x: Ascending logits of an isotonic map to probabilities; empty: logistic.
        calibration_y: Probabilities at ``calibration_x`` (non-decreasing).
    """

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    hidden_weights: tuple[tuple[float, ...], ...] = ()
    hidden_bias: tuple[float, ...] = ()
    calibration_x: tuple[float, ...] = ()
    calibration_y: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        width = len(self.features)
        assert len(self.mean) == len(self.scale) == width, "one mean and scale per feature"
        assert all(s > 0.0 for s in self.scale), "scales must be positive"
        inputs = len(self.hidden_weights) if self.hidden_weights else width
        assert len(self.weights) == inputs, f"{len(self.weights)} weights for {inputs} inputs"
        assert len(self.hidden_bias) == len(self.hidden_weights), "one bias per hidden unit"
        assert all(len(row) == width for row in self.hidden_weights), "hidden rows per feature"
        assert len(self.calibration_x) == len(self.calibration_y), "isotonic knots in pairs"

    def logits(self, rows: np.ndarray) -> np.ndarray:
        """[n] float64 logits of ``rows`` [n, len(features)]."""
        z = (np.asarray(rows, dtype=np.float64) - np.asarray(self.mean)) / np.asarray(self.scale)
        if self.hidden_weights:
            z = np.maximum(z @ np.asarray(self.hidden_weights).T + np.asarray(self.hidden_bias), 0)
        return z @ np.asarray(self.weights) + self.bias

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        """[n] probabilities: the isotonic map of the logits when fitted, else the logistic."""
        logits = self.logits(rows)
        if self.calibration_x:
            return np.interp(logits, self.calibration_x, self.calibration_y)
        return 1.0 / (1.0 + np.exp(-logits))

    def probability(self, row: Mapping[str, float]) -> float:
        """The probability of one row given by feature name."""
        return float(self.probabilities(np.array([[row[name] for name in self.features]]))[0])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedModel:
        """Read :meth:`to_dict`'s output.

        Raises:
            KeyError, TypeError, ValueError: The dict is not such a model.
        """

        def floats(values: Sequence[Any]) -> tuple[float, ...]:
            return tuple(float(value) for value in values)

        try:
            return cls(
                features=tuple(str(name) for name in data["features"]),
                mean=floats(data["mean"]),
                scale=floats(data["scale"]),
                weights=floats(data["weights"]),
                bias=float(data["bias"]),
                hidden_weights=tuple(floats(row) for row in data.get("hidden_weights", ())),
                hidden_bias=floats(data.get("hidden_bias", ())),
                calibration_x=floats(data.get("calibration_x", ())),
                calibration_y=floats(data.get("calibration_y", ())),
            )
        except AssertionError as err:
            raise ValueError(f"inconsistent fitted model: {err}") from err
