"""95% bootstrap intervals over questions, and paired differences between two policies.

Every quality figure is a mean over questions; its interval comes from resampling the questions
with replacement (percentile bootstrap, a seeded torch.Generator, so a report is reproducible). Two
policies measured on the same questions are compared question by question: the interval of the
mean paired difference, and a two-sided bootstrap p-value for "no difference" (the share of
resampled means on the other side of zero, doubled). Latencies under load are summarised by their
median, with its interval, and two servers' medians by their ratio (each sample resampled on
its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

RESAMPLES = 2000
SEED = 20261125


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% bootstrap interval."""

    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.1f} [{self.low:.1f}, {self.high:.1f}]"


@dataclass(frozen=True)
class PairedDifference:
    """Mean of ``a - b`` over paired questions, its interval, and the bootstrap p-value."""

    difference: Interval
    p_value: float
    num_questions: int

    def __str__(self) -> str:
        return (
            f"{self.difference.mean:+.1f} [{self.difference.low:+.1f}, {self.difference.high:+.1f}]"
        )


def _as_tensor(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.float64)


def _resamples(values: Sequence[float], resamples: int, seed: int) -> torch.Tensor:
    """[resamples, len(values)]: ``values`` drawn with replacement, one row per resample."""
    data = _as_tensor(values)
    rng = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(data), (resamples, len(data)), generator=rng)
    return data[picks]


def _resampled_means(values: Sequence[float], resamples: int, seed: int) -> torch.Tensor:
    return _resamples(values, resamples, seed).mean(dim=1)


def _median(values: torch.Tensor) -> torch.Tensor:
    """Medians along the last dimension (the mean of the middle two for an even count)."""
    return torch.quantile(values, 0.5, dim=-1)


def _percentiles(statistic: torch.Tensor) -> tuple[float, float]:
    low, high = torch.quantile(statistic, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return float(low), float(high)


def median_interval(
    values: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> Interval:
    """The median of ``values`` (e.g. request latencies) and its 95% bootstrap interval."""
    if not values:
        raise ValueError("no values to bootstrap; measure at least one request")
    median = float(_median(_as_tensor(values)))
    return Interval(median, *_percentiles(_median(_resamples(values, resamples, seed))))


def ratio_of_medians(
    first: Sequence[float], second: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> Interval:
    """``median(first) / median(second)`` and its 95% bootstrap interval.

    The two samples are independent (e.g. two servers' latencies under the same load), so
    each is resampled on its own.
    """
    if not first or not second:
        raise ValueError("a ratio of medians needs values on both sides")
    ratio = float(_median(_as_tensor(first)) / _median(_as_tensor(second)))
    ratios = _median(_resamples(first, resamples, seed)) / _median(
        _resamples(second, resamples, seed + 1)
    )
    return Interval(ratio, *_percentiles(ratios))


def bootstrap_interval(
    values: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> Interval:
    """The mean of ``values`` and its 95% percentile-bootstrap interval."""
    if not values:
        raise ValueError("no values to bootstrap; measure at least one question")
    mean = float(_as_tensor(values).mean())
    if len(values) == 1:
        return Interval(mean, mean, mean)
    return Interval(mean, *_percentiles(_resampled_means(values, resamples, seed)))


def paired_difference(
    first: Sequence[float], second: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> PairedDifference:
    """``first - second`` per question (the same questions in the same order)."""
    if len(first) != len(second):
        raise ValueError(
            f"paired values need the same questions: {len(first)} against {len(second)}"
        )
    differences = [a - b for a, b in zip(first, second, strict=True)]
    interval = bootstrap_interval(differences, resamples, seed)
    if len(differences) < 2 or all(d == 0 for d in differences):
        return PairedDifference(interval, 1.0, len(differences))
    means = _resampled_means(differences, resamples, seed)
    below = float((means <= 0).double().mean())
    above = float((means >= 0).double().mean())
    return PairedDifference(interval, min(1.0, 2 * min(below, above)), len(differences))
