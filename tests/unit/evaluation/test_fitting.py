"""The learned controllers' fitting tools: models that fit what they are shown, judged fairly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from adarag.evaluation.profiling.fitting import (
    auroc,
    fit_logistic,
    fit_mlp,
    fold_names,
    leave_one_group_out,
    with_isotonic,
)
from adarag.fitted import FittedModel


def test_auroc_counts_pairs_and_ties():
    scores = [0.1, 0.4, 0.35, 0.8, 0.4]
    labels = [0, 0, 1, 1, 1]
    positive = [s for s, label in zip(scores, labels, strict=True) if label]
    negative = [s for s, label in zip(scores, labels, strict=True) if not label]
    pairs = [(p, n) for p in positive for n in negative]
    expected = sum((p > n) + 0.5 * (p == n) for p, n in pairs) / len(pairs)
    assert auroc(scores, labels) == pytest.approx(expected)
    assert auroc([1, 2, 3], [0, 0, 1]) == 1.0
    assert np.isnan(auroc([1, 2], [1, 1]))


def _separable(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, 0.0]
    y = (x[:, 0] - 0.2 * x[:, 1] + 1.0 > 0).astype(np.float64)
    return x, y


def test_logistic_regression_finds_the_separating_direction():
    x, y = _separable()
    model = fit_logistic(x, y, ["a", "b", "c"], l2=1e-4)
    assert auroc(model.logits(x), y) > 0.99
    raw = np.array(model.weights) / np.array(model.scale)  # back to unscaled features
    assert raw[0] > 0 and raw[1] < 0 and abs(raw[2]) < abs(raw[0])
    assert raw[1] / raw[0] == pytest.approx(-0.2, abs=0.05)


def test_weights_decide_which_rows_count():
    x = np.array([[0.0], [1.0], [0.0], [1.0]])
    y = np.array([0.0, 1.0, 1.0, 0.0])  # contradicting pairs
    towards_first = fit_logistic(x, y, ["a"], np.array([10.0, 10.0, 0.1, 0.1]))
    towards_second = fit_logistic(x, y, ["a"], np.array([0.1, 0.1, 10.0, 10.0]))
    assert towards_first.weights[0] > 0 > towards_second.weights[0]


def test_mlp_is_seeded_and_learns_what_a_line_cannot():
    grid = np.array(list(itertools.product([-1.0, 1.0], repeat=2)) * 50)
    rng = np.random.default_rng(1)
    x = grid + rng.normal(scale=0.1, size=grid.shape)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.float64)  # XOR
    line = fit_logistic(x, y, ["a", "b"])
    net = fit_mlp(x, y, ["a", "b"], hidden=8, epochs=600, seed=3)
    again = fit_mlp(x, y, ["a", "b"], hidden=8, epochs=600, seed=3)
    assert auroc(line.logits(x), y) < 0.7 < 0.95 < auroc(net.logits(x), y)
    assert net == again


def test_isotonic_calibration_maps_logits_to_frequencies():
    x, y = _separable(2)
    model = with_isotonic(fit_logistic(x, y, ["a", "b", "c"], l2=0.5), x, y)
    p = model.probabilities(x)
    assert np.all((0.0 <= p) & (p <= 1.0))
    assert abs(p.mean() - y.mean()) < 0.02  # isotonic fits keep the mean
    order = np.argsort(model.logits(x))
    assert np.all(np.diff(p[order]) >= -1e-12)  # monotone in the logit


def test_leave_one_group_out_never_trains_on_the_held_out_group():
    groups = ["a", "a", "b", "c", "b"]
    seen = leave_one_group_out(groups, lambda train, test: (train.copy(), test.copy()))
    assert list(seen) == ["a", "b", "c"]
    for group, (train, test) in seen.items():
        held = [g == group for g in groups]
        assert test.tolist() == held and train.tolist() == [not h for h in held]


def test_a_fitted_model_survives_its_dict_and_rejects_a_broken_one():
    x, y = _separable()
    model = with_isotonic(fit_mlp(x, y, ["a", "b", "c"], hidden=4, epochs=50), x, y)
    again = FittedModel.from_dict(model.to_dict())
    assert again == model
    np.testing.assert_allclose(again.probabilities(x), model.probabilities(x))
    broken = model.to_dict() | {"weights": [1.0]}
    with pytest.raises(ValueError, match="weights"):
        FittedModel.from_dict(broken)


def test_variants_of_one_data_set_are_held_out_together():
    datasets = ["musique", "2wikimqa", "2wikimqa-gold", "hotpotqa", "2wikimqa-short"]
    assert fold_names(datasets) == ["musique", "2wikimqa", "2wikimqa", "hotpotqa", "2wikimqa"]
    assert fold_names(["2wikimqa", "2wikimqa-gold", "2wikimqa"], folds=2) == [
        "fold 0",
        "fold 1",
        "fold 0",
    ]
