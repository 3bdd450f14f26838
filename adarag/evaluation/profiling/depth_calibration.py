"""``adarag calibrate --depth``: fit the depth probe and choose where it stops.

From depth records (:mod:`.depth_probe`), with questions split into folds (one data set each
when there are several, else four folds of questions):

- each feature family's AUROC for "no later depth answers better", with probabilities from
  probes fitted without the question's fold (cross-fitting);
- the penalty, threshold and floor of the ``probe`` stop rule: those whose stops, replayed over
  the cross-fitted probabilities, gain the most gold F1 over fixed top-k at the same mean prompt
  tokens;
- the probe itself, fitted on every question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adarag.evaluation.profiling.depth_probe import (
    DepthRecord,
    first_confident,
    fit_probe,
    probe_features,
    step_probabilities,
)
from adarag.evaluation.profiling.fitting import auroc, fold_names
from adarag.profiles.learned import DepthProbe

FAMILIES = ("hidden", "signals", "all")
THRESHOLDS = tuple(np.round(np.arange(0.05, 0.96, 0.05), 2))
FLOORS = (1, 2, 3)
PENALTIES = (0.05, 0.5, 5.0)
"""L2 penalties tried (per standardised weight): the residual stream has hundreds of features."""


@dataclass(frozen=True)
class StopOutcome:
    """A stop rule replayed over questions: mean gold F1 (points) and prompt tokens."""

    f1: float
    tokens: float
    depth: float
    gain: float
    """F1 minus fixed top-k's at the same mean prompt tokens."""


def fixed_curve(records: Sequence[DepthRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Fixed top-k for every k: mean prompt tokens and mean gold F1 (points), by tokens."""
    depth = min(len(r.f1) for r in records)
    tokens = np.array([np.mean([r.prompt_tokens[k] for r in records]) for k in range(depth)])
    f1 = np.array([100 * np.mean([r.f1[k] for r in records]) for k in range(depth)])
    order = np.argsort(tokens)
    return tokens[order], f1[order]


def outcome(records: Sequence[DepthRecord], depths: Sequence[int]) -> StopOutcome:
    """Each record answering at its depth (1-based), against fixed top-k at equal tokens."""
    f1 = 100 * np.mean([r.f1[d - 1] for r, d in zip(records, depths, strict=True)])
    tokens = float(np.mean([r.prompt_tokens[d - 1] for r, d in zip(records, depths, strict=True)]))
    curve_tokens, curve_f1 = fixed_curve(records)
    fixed = float(np.interp(tokens, curve_tokens, curve_f1))
    return StopOutcome(float(f1), tokens, float(np.mean(depths)), float(f1) - fixed)


def cross_fitted(
    records: Sequence[DepthRecord], folds: Sequence[str], features: Sequence[str], l2: float
) -> list[np.ndarray]:
    """Per record, every step's probability from a probe fitted without the record's fold."""
    out: list[np.ndarray] = [np.empty(0)] * len(records)
    for fold in dict.fromkeys(folds):
        model = fit_probe(
            [r for r, f in zip(records, folds, strict=True) if f != fold], features, l2
        )
        for idx, (record, f) in enumerate(zip(records, folds, strict=True)):
            if f == fold:
                out[idx] = step_probabilities(model, record)
    return out


@dataclass(frozen=True)
class ProbeCalibration:
    """What ``adarag calibrate --depth`` fitted and measured.

    Attributes:
        probe: The fitted probe with its threshold and floor.
        family_auroc: Per feature family, the cross-fitted AUROC of "no later depth answers
            better" over every step (the best over the penalties tried).
        chosen: The chosen rule replayed on cross-fitted probabilities.
        per_fold: The chosen rule per fold (held out).
        oracle: The per-question oracle depth replayed (the headroom).
        num_questions: Questions fitted on.
        penalty: The L2 penalty chosen.
    """

    probe: DepthProbe
    family_auroc: tuple[tuple[str, float], ...]
    chosen: StopOutcome
    per_fold: tuple[tuple[str, int, StopOutcome], ...]
    oracle: StopOutcome
    num_questions: int
    penalty: float


def oracle_depths(records: Sequence[DepthRecord]) -> list[int]:
    """Each record's smallest depth with its best gold F1."""
    return [int(np.argmax(r.f1 >= r.f1.max())) + 1 for r in records]


def calibrate_probe(
    records: Sequence[DepthRecord],
    family: str = "all",
    penalties: Sequence[float] = PENALTIES,
) -> ProbeCalibration:
    """Fit the probe on ``records`` and choose its penalty, threshold and floor (see the module)."""
    folds = fold_names([record.dataset for record in records])
    width = records[0].hidden.shape[1]
    labels = np.concatenate([r.labels() for r in records])
    features = probe_features(width, family)
    best: tuple[float, float, int, StopOutcome, list[np.ndarray]] | None = None
    aurocs: dict[str, float] = {}
    for l2 in penalties:
        by_family = {
            name: cross_fitted(records, folds, probe_features(width, name), l2) for name in FAMILIES
        }
        for name, found in by_family.items():
            value, previous = auroc(np.concatenate(found), labels), aurocs.get(name, np.nan)
            aurocs[name] = value if np.isnan(previous) or value > previous else previous
        probabilities = by_family[family]
        for floor in FLOORS:
            for threshold in THRESHOLDS:
                depths = [first_confident(p, threshold, floor) for p in probabilities]
                result = outcome(records, depths)
                if best is None or result.gain > best[3].gain:
                    best = (l2, float(threshold), floor, result, probabilities)
    assert best is not None
    l2, threshold, floor, chosen, probabilities = best
    per_fold = []
    for fold in dict.fromkeys(folds):
        rows = [idx for idx, f in enumerate(folds) if f == fold]
        depths = [first_confident(probabilities[idx], threshold, floor) for idx in rows]
        per_fold.append((fold, len(rows), outcome([records[idx] for idx in rows], depths)))
    model = fit_probe(records, features, l2)
    return ProbeCalibration(
        DepthProbe(model, threshold, floor, records[0].layers),
        tuple(aurocs.items()),
        chosen,
        tuple(per_fold),
        outcome(records, oracle_depths(records)),
        len(records),
        l2,
    )
