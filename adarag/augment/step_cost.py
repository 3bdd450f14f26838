"""What an augmentation step costs: a fixed part per prefill plus a part per processed token.

Every step is a prefill of its own: it reads all the weights once, re-runs the question suffix
and the lens check, whatever the number of new tokens. On a memory-bound CPU that fixed part is a
large share of a small step (Qwen2.5-0.5B here: about 0.4 s, against about 2 s for a one-shot
6-chunk prefill), so a stop rule saves time only if it stops early enough to pay for its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adarag.errors import ConfigError


@dataclass(frozen=True)
class StepCostModel:
    """Seconds of a prefill that processes ``tokens`` prompt tokens: ``fixed_s + per_token_s * n``.

    Attributes:
        fixed_s: The part every prefill pays.
        per_token_s: The part per processed token.
    """

    fixed_s: float
    per_token_s: float

    def __call__(self, tokens: int) -> float:
        """Predicted seconds of one prefill."""
        return self.fixed_s + self.per_token_s * tokens

    @classmethod
    def tokens_only(cls) -> StepCostModel:
        """Cost proportional to tokens (when no step was timed)."""
        return cls(0.0, 1.0)

    @classmethod
    def fit(cls, tokens: Sequence[int], seconds: Sequence[float]) -> StepCostModel:
        """Least squares over timed steps, both parts kept non-negative.

        Raises:
            ConfigError: Fewer than two steps, or tokens and seconds of different lengths.
        """
        if len(tokens) < 2 or len(tokens) != len(seconds):
            raise ConfigError(f"a step-cost fit needs at least 2 timed steps, got {len(seconds)}")
        x = np.asarray(tokens, dtype=np.float64)
        y = np.asarray(seconds, dtype=np.float64)
        if np.ptp(x) == 0:
            return cls(0.0, float(y.mean() / max(x[0], 1.0)))
        slope, intercept = np.polyfit(x, y, 1)
        if slope <= 0:
            return cls(float(y.mean()), 0.0)
        if intercept < 0:
            return cls(0.0, float((x @ y) / (x @ x)))
        return cls(float(intercept), float(slope))

    def share(self, step_tokens: int, static_tokens: int) -> float:
        """A step's predicted time as a share of the static top-k prefill's."""
        return self(step_tokens) / self(static_tokens)
