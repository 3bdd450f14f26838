"""Fitting the learned selector on oracle labels, and how well a scorer finds the oracle's set.

The training rows are every candidate of every calibration question, the label whether the
output-aware oracle recomputes it at the target ratio; each question weighs the same in the
loss, however long its prompt. A scorer is judged per question the way the engine uses it: its
top ``budget`` candidates (one global budget, as ``budget="global"`` spends it) against the
oracle's chosen set (recall at the same budget), and the share of the oracle's first-order gain
its set captures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adarag.engine.token_features import derive_features
from adarag.evaluation.profiling.fitting import auroc, fit_logistic, fit_mlp
from adarag.evaluation.profiling.selector_labels import SelectorRecord
from adarag.fitted import FittedModel

SELECTOR_FEATURES = (
    "log_v_dev",
    "log_k_dev",
    "log_v_norm",
    "log_q_mass",
    "log_last_mass",
    "rel_offset",
    "log_offset",
    "chunk_start",
    "chunk_end",
    "chunk_order",
    "log_chunk_length",
    "log_v_dev@chunk",
    "log_q_mass@chunk",
)
"""The features a selector reads before the layer bands of the query's attention are added."""


def selector_features(num_layers: int, bands: int = 4) -> tuple[str, ...]:
    """:data:`SELECTOR_FEATURES` plus the query's attention in ``bands`` equal layer bands."""
    edges = sorted(set(np.linspace(0, num_layers, min(bands, num_layers) + 1).round().astype(int)))
    banded = tuple(
        f"log_{which}_mass:{first}-{last}"
        for which in ("q", "last")
        for first, last in zip(edges[:-1], edges[1:], strict=True)
    )
    return SELECTOR_FEATURES + banded


def num_layers_of(record: SelectorRecord) -> int:
    """The model's layer count, read from the record's columns."""
    return sum(1 for name in record.columns if name.startswith("q_mass_"))


@dataclass(frozen=True)
class TrainingRows:
    """Every candidate of some questions: features, oracle label, weight, question index."""

    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray
    question: np.ndarray


def training_rows(
    records: Sequence[SelectorRecord], features: Sequence[str], ratio: float
) -> TrainingRows:
    """The rows of ``records``: ``features`` derived, labelled by the oracle's set at ``ratio``."""
    xs, ys, ws, qs = [], [], [], []
    for idx, record in enumerate(records):
        x = derive_features(record.features.numpy(), features, num_layers_of(record))
        xs.append(x)
        ys.append(record.chosen(ratio).numpy().astype(np.float64))
        ws.append(np.full(len(x), 1.0 / len(x)))
        qs.append(np.full(len(x), idx))
    return TrainingRows(
        np.concatenate(xs), np.concatenate(ys), np.concatenate(ws), np.concatenate(qs)
    )


def fit_selector(
    records: Sequence[SelectorRecord],
    features: Sequence[str],
    ratio: float = 0.2,
    kind: str = "logistic",
    seed: int = 0,
) -> FittedModel:
    """A scorer of candidates fitted to the oracle's set at ``ratio``.

    Args:
        records: Calibration questions' labels.
        features: Derived feature names (:func:`~adarag.engine.token_features.derive_features`).
        ratio: The labelled ratio whose oracle set is the target.
        kind: ``"logistic"`` or ``"mlp"`` (one hidden layer of 16).
        seed: Seeds the network's initial weights.
    """
    rows = training_rows(records, features, ratio)
    if kind == "mlp":
        return fit_mlp(rows.x, rows.y, features, rows.weights, seed=seed)
    if kind != "logistic":
        raise ValueError(f"unknown selector kind {kind!r}; choose logistic or mlp")
    return fit_logistic(rows.x, rows.y, features, rows.weights)


@dataclass(frozen=True)
class SelectionQuality:
    """How one scorer's choices compare with the oracle's on one question at one ratio."""

    recall: float
    gain_share: float
    auroc: float


def selection_quality(record: SelectorRecord, scores: np.ndarray, ratio: float) -> SelectionQuality:
    """``scores`` [n] (higher first) judged against the oracle's set at ``ratio``."""
    budget = record.budgets[ratio]
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:budget]
    chosen = np.zeros(len(scores), dtype=bool)
    chosen[order] = True
    oracle = record.chosen(ratio).numpy()
    gain = np.clip(record.gain.numpy().astype(np.float64), 0.0, None)
    best = gain[oracle].sum()
    return SelectionQuality(
        recall=float((chosen & oracle).sum() / max(budget, 1)),
        gain_share=float(gain[chosen].sum() / best) if best > 0 else float("nan"),
        auroc=auroc(scores, oracle),
    )


def scorer_scores(model: FittedModel, record: SelectorRecord) -> np.ndarray:
    """[n] the fitted scorer's scores of one record's candidates."""
    x = derive_features(record.features.numpy(), model.features, num_layers_of(record))
    return model.logits(x)


def feature_scores(name: str, record: SelectorRecord) -> np.ndarray:
    """[n] one derived feature as a score (e.g. ``log_query_deviation``, the default rule)."""
    return derive_features(record.features.numpy(), [name], num_layers_of(record))[:, 0]
