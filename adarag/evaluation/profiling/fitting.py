"""Fitting the learned controllers' small models, and judging them on held-out groups.

Shared by the recomputation selector, the routing ladder and the depth probe: a regularised
logistic regression or a one-hidden-layer network (seeded, in torch, on the CPU) over
standardised features, returned as the :class:`~adarag.fitted.FittedModel` the profile stores;
an isotonic map from logits to calibrated probabilities; AUROC; and leave-one-group-out
evaluation (train on every data set but one, judge on that one).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np
import torch

from adarag.augment.agreement import IsotonicMap
from adarag.fitted import FittedModel

T = TypeVar("T")


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve: P(a positive scores above a negative), ties counting half.

    Returns NaN when ``labels`` holds one class only.
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels, dtype=bool)
    num_pos, num_neg = int(positive.sum()), int((~positive).sum())
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    # average ranks over ties (1-based)
    start = 0
    while start < scores.size:
        end = start
        while end + 1 < scores.size and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return float((ranks[positive].sum() - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg))


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[~(scale > 1e-9)] = 1.0
    return mean, scale


def fit_logistic(
    x: np.ndarray,
    y: np.ndarray,
    names: Sequence[str],
    weights: np.ndarray | None = None,
    l2: float = 1e-3,
) -> FittedModel:
    """Weighted logistic regression with an L2 penalty on the standardised weights.

    Args:
        x: [n, len(names)] features.
        y: [n] labels in {0, 1} (or probabilities).
        names: The features' names.
        weights: [n] sample weights (None: equal); they are normalised to mean 1.
        l2: Penalty on the squared weights (not the bias), per unit of total weight.
    """
    x = np.asarray(x, dtype=np.float64)
    mean, scale = _standardise(x)
    z = torch.from_numpy((x - mean) / scale)
    target = torch.from_numpy(np.asarray(y, dtype=np.float64))
    w = torch.ones(len(z), dtype=torch.float64) if weights is None else torch.from_numpy(weights)
    w = w / w.mean()
    coef = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS(
        [coef, bias], lr=1.0, max_iter=200, tolerance_grad=1e-9, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        logits = z @ coef + bias
        loss = (
            w
            * torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
        ).mean() + l2 * coef.pow(2).sum()
        loss.backward()
        return loss

    with torch.inference_mode(False), torch.enable_grad():
        optimiser.step(closure)
    return FittedModel(
        features=tuple(names),
        mean=tuple(float(v) for v in mean),
        scale=tuple(float(v) for v in scale),
        weights=tuple(float(v) for v in coef.detach()),
        bias=float(bias.detach()),
    )


def fit_mlp(
    x: np.ndarray,
    y: np.ndarray,
    names: Sequence[str],
    weights: np.ndarray | None = None,
    hidden: int = 16,
    l2: float = 1e-4,
    epochs: int = 400,
    seed: int = 0,
) -> FittedModel:
    """A one-hidden-layer network (ReLU) trained full-batch with Adam, seeded.

    Args:
        x: [n, len(names)] features.
        y: [n] labels in {0, 1}.
        names: The features' names.
        weights: [n] sample weights (None: equal).
        hidden: Hidden units.
        l2: Weight decay.
        epochs: Full-batch steps.
        seed: Seeds the initial weights.
    """
    x = np.asarray(x, dtype=np.float64)
    mean, scale = _standardise(x)
    z = torch.from_numpy((x - mean) / scale).float()
    target = torch.from_numpy(np.asarray(y, dtype=np.float32))
    w = torch.ones(len(z)) if weights is None else torch.from_numpy(weights).float()
    w = w / w.mean()
    first, second = _seeded_layers(z.shape[1], hidden, seed)
    parameters = [*first.parameters(), *second.parameters()]
    optimiser = torch.optim.Adam(parameters, lr=1e-2, weight_decay=l2)
    with torch.inference_mode(False), torch.enable_grad():
        for _ in range(epochs):
            optimiser.zero_grad()
            logits = second(torch.relu(first(z))).squeeze(1)
            loss = (
                w
                * torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, target, reduction="none"
                )
            ).mean()
            loss.backward()
            optimiser.step()
    return FittedModel(
        features=tuple(names),
        mean=tuple(float(v) for v in mean),
        scale=tuple(float(v) for v in scale),
        weights=tuple(float(v) for v in second.weight.detach()[0]),
        bias=float(second.bias.detach()[0]),
        hidden_weights=tuple(tuple(float(v) for v in row) for row in first.weight.detach()),
        hidden_bias=tuple(float(v) for v in first.bias.detach()),
    )


def _seeded_layers(width: int, hidden: int, seed: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The network's two layers, weights uniform in ±1/sqrt(fan-in) from ``seed``, biases 0."""
    rng = torch.Generator().manual_seed(seed)
    first, second = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        for layer in (first, second):
            bound = 1.0 / layer.in_features**0.5
            layer.weight.copy_(torch.rand(layer.weight.shape, generator=rng) * 2 * bound - bound)
            layer.bias.zero_()
    return first, second


def with_isotonic(model: FittedModel, x: np.ndarray, y: np.ndarray) -> FittedModel:
    """``model`` with an isotonic map from its logits on ``x`` to the frequencies of ``y``."""
    fitted = IsotonicMap.fit(list(model.logits(x)), list(np.asarray(y, dtype=np.float64)))
    return replace(model, calibration_x=fitted.x, calibration_y=fitted.y)


def source_of(dataset: str) -> str:
    """The data set's source: variants of one set (``2wikimqa-gold``) share its questions."""
    return dataset.split("-", 1)[0]


def fold_names(datasets: Sequence[str], folds: int = 4) -> list[str]:
    """Each question's fold: its data set's source when there are several, else one of ``folds``.

    Variants of one data set (``2wikimqa``, ``2wikimqa-gold``, ``2wikimqa-short``) ask the same
    questions, so they are held out together.
    """
    sources = [source_of(dataset) for dataset in datasets]
    if len(set(sources)) > 1:
        return sources
    return [f"fold {idx % folds}" for idx in range(len(datasets))]


def leave_one_group_out(
    groups: Sequence[Hashable],
    evaluate: Callable[[np.ndarray, np.ndarray], T],
) -> dict[Hashable, T]:
    """``evaluate(train_mask, test_mask)`` once per group, the group held out.

    Args:
        groups: The group of every example (e.g. its data set).
        evaluate: Fits on the rows of the first mask and judges on those of the second.
    """
    labels = np.asarray(list(groups), dtype=object)
    return {group: evaluate(labels != group, labels == group) for group in dict.fromkeys(groups)}
