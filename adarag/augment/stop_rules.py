"""Stop rules of adaptive context augmentation: when to stop adding chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from adarag.augment.evidence import ScoredStep
from adarag.errors import ConfigError
from adarag.schema import StopReason


class StopRule(Protocol):
    """Decides after each step whether to decode now."""

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """Whether the caller should decode ``step``'s first answer tokens before :meth:`decide`."""
        ...

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """``"confident"`` or ``"exhausted"`` to stop after ``step``, None to go on."""
        ...


def _check_floor(threshold: float, min_steps: int) -> None:
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold (τ) must be in [0, 1], got {threshold}")
    if min_steps < 1:
        raise ConfigError(f"min_steps must be at least 1, got {min_steps}")


@dataclass(frozen=True)
class ThresholdStop:
    """Stop at the first step whose lens confidence reaches τ, or after the last chunk.

    Args:
        threshold: τ in [0, 1].
        min_steps: Never stop on confidence before this many chunks are in the prompt.
    """

    threshold: float
    min_steps: int = 1

    def __post_init__(self) -> None:
        _check_floor(self.threshold, self.min_steps)

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """Never: the confidence alone decides."""
        return False

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step.num_chunks >= self.min_steps and step.confidence.value >= self.threshold:
            return "confident"
        return "exhausted" if step.num_chunks >= max_steps else None


@dataclass(frozen=True)
class AgreementStop:
    """Stop when two signals agree: the answer is stable and its agreement is likely.

    A step stops when at least ``min_steps`` chunks are in the prompt, its calibrated probability
    of giving the static top-k answer reaches τ (chosen for a risk ε by calibration), and its
    first answer tokens equal the previous step's (TASR's answer stability); else after the last
    chunk. Answer tokens are decoded only at steps whose probability reaches τ, so a stop needs two
    consecutive confident steps with the same answer, and unconfident steps decode nothing.

    Args:
        threshold: τ on the calibrated probability, in [0, 1].
        min_steps: The floor on the chunks in the prompt (stability needs at least 2).
    """

    threshold: float
    min_steps: int = 2

    def __post_init__(self) -> None:
        _check_floor(self.threshold, self.min_steps)

    def wants_answer_prefix(self, step: ScoredStep) -> bool:
        """At confident steps from one before the floor (whose answer the floor step compares)."""
        return (
            step.probability is not None
            and step.num_chunks >= self.min_steps - 1
            and step.probability >= self.threshold
        )

    def decide(self, step: ScoredStep, max_steps: int) -> StopReason | None:
        """See the class docstring."""
        if step.probability is None:
            raise ConfigError(
                "the agreement stop rule needs a calibrated agreement model; run "
                "`adarag calibrate` for this model or set augment.stop_rule='confidence'"
            )
        if (
            step.num_chunks >= self.min_steps
            and step.result.is_stable
            and step.probability >= self.threshold
        ):
            return "confident"
        return "exhausted" if step.num_chunks >= max_steps else None
