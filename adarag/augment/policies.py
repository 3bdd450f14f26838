"""Stop rules of adaptive context augmentation: when to stop adding chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from adarag.errors import ConfigError
from adarag.schema import StopReason


class StopRule(Protocol):
    """Decides after each step whether to decode now."""

    def decide(self, confidence: float, step: int, max_steps: int) -> StopReason | None:
        """``"confident"`` or ``"exhausted"`` to stop after ``step`` (1-based), None to go on."""
        ...


@dataclass(frozen=True)
class ThresholdStop:
    """Stop at the first step whose confidence reaches τ, or after the last chunk.

    Args:
        threshold: τ in [0, 1].
        min_steps: Never stop on confidence before this many chunks are in the prompt.
    """

    threshold: float
    min_steps: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold (τ) must be in [0, 1], got {self.threshold}")
        if self.min_steps < 1:
            raise ConfigError(f"min_steps must be at least 1, got {self.min_steps}")

    def decide(self, confidence: float, step: int, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step >= self.min_steps and confidence >= self.threshold:
            return "confident"
        if step >= max_steps:
            return "exhausted"
        return None
