"""The ``gain`` stop rule's calibration: the τ and order ``adarag calibrate --gain-records`` chose.

The rule keeps the retrieved chunks whose information gain reaches τ (``adarag.augment.gain``).
Calibration replays recorded questions (``benchmarks/depth.py gain --split calibration``) and
keeps the (order, τ) whose F1 is furthest above fixed top-k at the same mean prompt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

GainOrderName = Literal["gain", "retrieval"]


@dataclass(frozen=True)
class GainCalibration:
    """The gain rule's fitted constants, as a model's profile keeps them.

    Attributes:
        threshold: τ, the gain a chunk must reach to be kept.
        order: How the chosen rule listed the kept chunks: best gain first, or as retrieved.
        num_questions: Calibration questions it was chosen on.
        datasets: Their data sets (the record files' names).
        f1_over_fixed: Its F1 less fixed top-k's at the same mean prompt tokens, in points, on
            the calibration questions.
        top_k: Tokens of the normalised entropy the recorded gains were computed over.
    """

    threshold: float
    order: GainOrderName
    num_questions: int
    datasets: tuple[str, ...]
    f1_over_fixed: float
    top_k: int = 20

    def __post_init__(self) -> None:
        assert self.order in ("gain", "retrieval"), f"unknown gain order {self.order!r}"
        assert self.top_k >= 2, "the normalised entropy needs at least 2 tokens"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "threshold": self.threshold,
            "order": self.order,
            "num_questions": self.num_questions,
            "datasets": list(self.datasets),
            "f1_over_fixed": self.f1_over_fixed,
            "top_k": self.top_k,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GainCalibration:
        """Read :meth:`to_dict`'s output."""
        return cls(
            float(data["threshold"]),
            data["order"],
            int(data["num_questions"]),
            tuple(str(name) for name in data.get("datasets", ())),
            float(data["f1_over_fixed"]),
            int(data.get("top_k", 20)),
        )
